"""The web console: the admin endpoints a page reads and drives, all under `/admin/` and
guarded by one rule (svir.edges.keys_service.admin_access): its operations (`ops.py`) and the data
it shows (`observe*`: the live feed, stats, request history and page; `capture*`: the opt-in
captures); and the page itself under `/ui` (its static files are `ui/`, served by
svir.edges.console_ui)."""
