"""What a caller asks of the engine, checked before anything runs.

Owns the arguments of one call (`requests`: `PrefillRequest`, `DecodeRequest`
and their `*Args`), how a decode picks tokens (`sampling_params`), what a
constrained decode must match (`constraint`), the model's role framing
(`chat`) and which workflow a call belongs to (`workflow`). Nothing here runs
the model. May import: `corps.cache`, `corps.engine.errors`; nothing else of
the engine.
"""
