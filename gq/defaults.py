"""Every number and name that means something, in one place, with its unit."""

#: Wire protocol version; a peer speaking another version gets an error reply.
PROTOCOL_VERSION = 1
#: Largest message gqd accepts, in bytes (a 10,000-task array spec fits easily).
MAX_MESSAGE_BYTES = 16 * 1024 * 1024

#: How often gqnode tells gqd it is alive, in seconds.
HEARTBEAT_INTERVAL_S = 2.0
#: A node silent this long is marked DOWN, in seconds.
NODE_TIMEOUT_S = 30.0
#: How often gqnode runs its `[node] health_check` program, and how long one run may take, in
#: seconds (Slurm kills its HealthCheckProgram after 60 s too).
HEALTH_CHECK_INTERVAL_S = 60.0
HEALTH_CHECK_TIMEOUT_S = 60.0
#: How often gqnode resends unacknowledged reports from its outbox, in seconds.
OUTBOX_RESEND_S = 2.0
#: How long the CLI waits for a reply before it calls the head unreachable, in seconds.
CLIENT_TIMEOUT_S = 15.0
#: Jobs the client asks for in one page of a listing (`gq queue`, `gq history`); gqd sends
#: fewer when their records would take over half of MAX_MESSAGE_BYTES.
PAGE_JOBS = 5000
#: How long a `wait` request is parked on the head before it is answered "still running", in seconds.
WAIT_POLL_S = 20.0

#: Node-fault requeues a job gets when it names no `--retries` ([head] default_retries; Slurm's
#: MaxBatchRequeue is 5 too), and the most it may name.
DEFAULT_RETRIES = 5
MAX_RETRIES = 1000
#: Between SIGTERM and SIGKILL when a job is cancelled or times out, in seconds.
KILL_GRACE_S = 10.0
#: How long before its time limit a job's `--signal` is sent when it names no time, in seconds
#: (Slurm's default), and the most it may name (Slurm's too).
SIGNAL_LEAD_S = 60
MAX_SIGNAL_LEAD_S = 65535
#: Time limit of a job that names none and whose QOS has no default, in seconds.
DEFAULT_TIME_LIMIT_S = 24 * 3600
#: Most tasks one `--array` may have, and its highest index.
MAX_ARRAY_TASKS = 100_000
MAX_ARRAY_INDEX = 9_999_999
#: Most messages one socket may hand the loop per iteration, so one busy peer cannot starve the rest.
MAX_BATCH = 2000
#: Longest the event loop sleeps with nothing to do, in seconds (timers are checked at least this often).
#: After a failed commit (a full disk), gqd's next scheduling pass waits this long, in seconds, so
#: that a pass which cannot be saved does not spin.
STORE_RETRY_S = 1.0
LOOP_TICK_S = 1.0
#: After a scheduling pass of t seconds, a pass for node events (job ends) waits until this many
#: t have passed: at most 1/(1 + this) of a head busy with them goes to passes, and the ends that
#: arrive meanwhile are seen by one pass together. A client's change (a submit) is not kept
#: waiting. A pass on a small queue takes well under a millisecond.
PASS_SPACING = 1.0

#: Most jobs (pending and running) gqd holds before it refuses submits ([head] max_queued_jobs).
MAX_QUEUED_JOBS = 200_000

#: The QOS a job gets when it names none.
DEFAULT_QOS = "normal"
#: Jobs of this many GPUs or more (all ranks together) are the "big" ones: the scheduler can
#: age them sooner and protect their reservations, and the simulator reports their waits apart.
BIG_JOB_GPUS = 8
#: Seconds a blocked job of a preempting QOS waits rather than preempt, by default: it preempts
#: only when its reservation is further off, and never a job that ends sooner by its limit.
PREEMPT_AFTER_S = 60.0
#: A job is exempt from preemption for at most this share of its time limit (else for the
#: QOS's preempt_exempt_s), so short inference jobs can be preempted while training jobs keep
#: their start-up time.
EXEMPT_LIMIT_SHARE = 0.25
#: Output file pattern when `-o` is not given (Slurm's is slurm-%j.out).
DEFAULT_OUTPUT = "gq-%j.out"

#: Names of the files in gqd's state directory.
DB_FILE = "gq.db"
#: The personal cluster's config file under $XDG_STATE_HOME/gq.
PERSONAL_CONFIG = "gq.toml"
#: System-wide config.
SYSTEM_CONFIG = "/etc/gq/gq.toml"
