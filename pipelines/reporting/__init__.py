"""The results report: its tables (`tables`), the reference levels of a task (`levels`) and the bar chart (`plot`);
`python -m pipelines.report` is its command line."""
