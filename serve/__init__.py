"""`corps serve`: an OpenAI-compatible HTTP API over one engine, with message handles
over HTTP as an extension (`corps_message_id`). `app` builds the ASGI app,
`schema` the request bodies, `chat` turns requests into engine calls and their
handles into responses, `metrics` the Prometheus counters. Needs `corps[serve]`."""
