"""Reading a pipeline definition JSON: its step graph, expressions, parameters and job requests.

Used by everything that reads a definition: upsert (diffs), the local runner (execution), compare (job requests)
and cost (instance types of a past execution).
"""
