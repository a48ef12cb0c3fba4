"""The public engine: `Engine` and the objects its calls return.

Owns the async facade (`engine`), building an engine's executor from its
config (`build`, the one place weights are loaded), submitting calls through
the access guard (`submit`, `access`), their trace events (`call_events`),
`Pending`, `TextStream` and `Engine.select`. May import every other engine
subpackage; none of them imports this one.
"""
