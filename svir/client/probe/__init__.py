"""`svir probe BASE_URL`: drive a model server directly through the behaviours the wire protocol
reference describes (§2.4 tools, §2.5 optional fields, §2.6 structured output, §2.2 images, §5
context overflow), and report what it kept, ignored or rejected, with the evidence.

Verdicts:
- `kept`: the server did what the field asks (a required tool was called, the JSON matched).
- `ignored`: the request was taken (200) and the field changed nothing it should have.
- `rejected`: the server refused the request (an HTTP error, or an error before any output).
- `failed`: the request was taken, then the stream failed.
- `accepted`: taken, with nothing in the answer to tell whether the field was acted on.
- `unclear`: the answer cannot tell (cut off by the token cap, a timeout, a broken connection).

The report's `suggested_provider_settings` uses svir's config field names (ProviderConfig), so it
can seed the provider's entry in svir.toml.

`payloads`: what the probe sends (the tools, the schema, the image, the efforts); `exchange`: one
request and what its answer showed; `session`: the connection, the requests and the findings of
one probe; `prober`: the checks, in order, and their verdicts; `suggest`: from the findings to a
provider's settings; `report`: the findings and the settings, as a table or JSON; `run`: the
command (`run_probe`).
"""
