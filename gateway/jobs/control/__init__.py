"""The job service behind the doors and what it keeps: see gateway.jobs."""
