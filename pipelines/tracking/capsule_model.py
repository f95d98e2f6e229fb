"""The registered capsule pyfunc as MLflow *models from code*: the file `pipelines.tracking.pyfunc` logs.

MLflow copies this file into every model version and runs it on `mlflow.pyfunc.load_model`; it names
the model with `mlflow.models.set_model`. A version thus holds source code, never a pickle (a pickled
``python_model.pkl`` runs whatever it contains when loaded).
"""

import mlflow

from pipelines.tracking.pyfunc import CapsulePyfunc

mlflow.models.set_model(CapsulePyfunc())
