"""Per-class benchmark, cost report, recommended policy and serving-path profile (`lookahead bench`)."""
