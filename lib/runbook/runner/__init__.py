"""Executes the notebooks with papermill and archives each run: parameters, results JSON, HTML,
retention, and the helpers notebooks call."""
