"""The web console (issue 18): what the admin API tells an operator, and the page under `/ui` that
shows it (its static files are `ui/`, served by svir.edges.console_ui)."""
