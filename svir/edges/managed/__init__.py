"""The `llama-server` processes svir runs itself for its `llamacpp-managed` providers.

`supervisor`: one provider's servers (started on demand, swapped, watched, unloaded when idle);
`launch`: what starting one server takes (its arguments, its log's name, its failures' words);
`install`: an app's supervisors, by provider, through config reloads; `defaults`: the
configuration of `svir serve` without a file.
"""
