"""`servebook experiment`: arms measured in blocks, interleaved, with ratios to a baseline
that carry intervals over blocks (spec, design, declared provenance, runner, analysis,
report)."""
