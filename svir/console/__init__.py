"""The web console's server side: the data it shows (observe*: the live feed, stats, request
history and detail; capture*: the opt-in captures) and its admin operations."""
