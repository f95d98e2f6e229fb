"""The registered capsule pyfunc as MLflow *models from code*: the file `pipelines.tracking.pyfunc` logs.

MLflow copies this file into every model version and runs it on `mlflow.pyfunc.load_model`; it names
the model with `mlflow.models.set_model`. A version thus holds source code, never a pickle (a pickled
``python_model.pkl`` runs whatever it contains when loaded). Before it imports anything of the project it
puts the version's own ``code/project_code.zip`` (`pipelines.tracking.bundle`) first on ``sys.path``: the
code that wrote the capsule reads it. Where no archive lies beside it (MLflow runs this file from the
source tree while logging) the process's own code serves.
"""

import sys
from pathlib import Path

_ARCHIVE = Path(__file__).with_name("code") / "project_code.zip"
if _ARCHIVE.is_file() and str(_ARCHIVE) not in sys.path:
    sys.path.insert(0, str(_ARCHIVE))

import mlflow  # noqa: E402 - after the archive is on sys.path

from pipelines.tracking.pyfunc import CapsulePyfunc  # noqa: E402

mlflow.models.set_model(CapsulePyfunc())
