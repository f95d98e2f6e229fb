"""The sweep behind `pipelines/sweep.py`: its config, its trials, their resources and the run itself.

Modules: `config` (`SweepConfig`, the YAML schema, the trial grid, the `pack:` section and its rules), `packs`
(who packs with whom), `rules` (cross-field checks),
`select` (`select:` candidates chosen on validation), `resources` (what a trial asks Ray for, how many run
at once), `pending` (trials Ray cannot place), `trial` (what runs inside a Tune trial, a
pack's too), `run` (the Tune
run, the tracking server, the results table, champion promotion).
"""
