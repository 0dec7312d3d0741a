"""Trajectory logs: the turn and episode records, the recorder that builds them, the JSONL sink."""
