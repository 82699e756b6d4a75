"""`trajforge view`: a read-only local web page over dataset directories and exports.

Modules, one job each:

- `sources`     — what the command line names -> the dataset directories and exports to show.
- `queries`     — DuckDB over the Parquet shards: filtered, sorted, paged lists; counts; one record.
- `records`     — a trajectory / pair / filtered record -> the JSON the page draws (segments, badges).
- `preview`     — how a trajectory or pair renders in each export format (the exporters' own row functions).
- `loss_tokens` — the tokens of a preview row with the loss flag each carries, for a given tokenizer.
- `api`         — what each API endpoint answers (facets and export options cached per dataset version).
- `server`      — the Starlette app (the page, its assets served locally, the JSON API, screenshots)
  and binding its socket (loopback unless told otherwise).
"""
