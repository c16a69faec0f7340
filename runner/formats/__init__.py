"""Requests in and records out, shared by every way into multiseq: `batch-run`, `multiseq.ray`,
the server and its Batch API.

Below them and above the engine: it turns prompt lines and OpenAI request bodies into
`Request`s (fields, reader), results into OpenAI response bodies and result lines (records,
openai_output), reads prompt files of any size (lines, scan, ids), writes and resumes result
files (output, resume), streams a file's items through a runner (batchrun), and keeps a run's
tally (summary). It never imports click, rich or an HTTP library.
"""
