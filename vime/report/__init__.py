"""What a simulation or a run shows a person: text tables, the JSON document, a Perfetto trace, an HTML report."""
