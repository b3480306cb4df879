"""Assembling and running a whole run from the configuration: simulated (`sim`), real (`real`), many (`sweep`), OOM fixes (`fixes`), the JSON document (`document`)."""
