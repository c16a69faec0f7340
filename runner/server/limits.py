"""The server's limits and timeouts by default: what `multiseq serve`'s options show, without
importing the HTTP app (batch-run starts faster without it)."""

DEFAULT_MAX_QUEUE = 256
DEFAULT_MAX_BODY_BYTES = 16 << 20
DEFAULT_MAX_UPLOAD_BYTES = 200 << 20  # OpenAI's limit for a batch input file
DEFAULT_MAX_BATCH_LINES = 50_000  # OpenAI's limit for the requests of one batch
RETRY_AFTER_SECONDS = 2
DEFAULT_PREPARE_THREADS = 2  # CPU work: more threads than cores only make each compile slower
DEFAULT_IO_THREADS = 4  # files and the database: short waits on the disk
DEFAULT_PREPARE_TIMEOUT_SECONDS = 30.0
DEFAULT_SEND_TIMEOUT_SECONDS = 30.0
DEFAULT_KEEP_ALIVE_SECONDS = 15.0  # under the 30 to 60 s idle timeouts of common proxies
MAX_STREAM_INTERVAL_SECONDS = 1.0  # a stream that waits longer between chunks no longer streams
