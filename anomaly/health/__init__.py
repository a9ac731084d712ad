"""``dpro health``: the nightly cluster health check (GPUs, NICs, collectives, the pairwise
host matrix), judged against baselines, remembered in a database, reported as JSON, Markdown
and HTML."""
