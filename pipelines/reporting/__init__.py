"""What `pipelines.report` draws on: the reference levels of a task (`levels`) and the bar chart (`plot`)."""
