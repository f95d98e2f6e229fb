"""The sweep behind `pipelines/sweep.py`: its config and trial grid (`config`), what a trial asks of Ray
(`resources`), what runs inside a Tune trial (`trial`), the Tune run itself (`run`) and what the sweep leaves
(`summary`, `parent_run`, `leftover`)."""
