"""Every number and name that means something, in one place, with its unit."""

#: Wire protocol version; a peer speaking another version gets an error reply.
PROTOCOL_VERSION = 1
#: Largest message gqd accepts, in bytes (a 10,000-task array spec fits easily). libzmq drops
#: the connection of a peer sending a larger frame before gqd sees any of it (MAXMSGSIZE).
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
#: Largest request on a TCP client endpoint (callers there may only read, unless [auth]
#: trust_tcp), and largest message from a node (its heartbeat's longest health line is 64 KiB),
#: in bytes.
MAX_TCP_REQUEST_BYTES = 1024 * 1024
MAX_NODE_MESSAGE_BYTES = 1024 * 1024
#: Most job specs in one submit request (an array of 100,000 tasks is one spec): a script with
#: more sends several requests (scripts/bench sends 5,000 a request).
MAX_SUBMIT_SPECS = 10_000
#: Most lists and maps in one message gqd or gqnode receives (a spec has three: itself, its env
#: and its args). A 16 MiB frame holds 16 million empty maps, which msgpack takes seconds and a
#: gigabyte to build; the unpacking stops past this many.
MAX_CONTAINERS = 4 * MAX_SUBMIT_SPECS + 1000
#: Client frames of up to this many bytes a turn of gqd's loop reads from one socket (at least
#: one; the rest wait in libzmq's queue, which takes each connection in turn). A frame over
#: DECODE_SLICE_BYTES instead waits with the large ones, which the loop unpacks for at most
#: DECODE_SLICE_S a turn, DECODE_SLICE_BYTES at a time; frames of up to MAX_DECODING_BYTES in
#: all wait so, and a large frame past that is refused as "busy".
RECV_BYTES_PER_TURN = 256 * 1024
DECODE_SLICE_BYTES = 64 * 1024
DECODE_SLICE_S = 0.005
MAX_DECODING_BYTES = 4 * MAX_MESSAGE_BYTES

#: How often gqnode tells gqd it is alive, in seconds.
HEARTBEAT_INTERVAL_S = 2.0
#: The marker file in a job's $GQ_CHECKPOINT_DIR: touching it reports a checkpoint (its mtime
#: goes to gqd with the node's heartbeats; `gq checkpoint` does the same through gqd).
CHECKPOINT_MARKER = ".gq-checkpoint"
#: A node silent this long is marked DOWN, in seconds.
NODE_TIMEOUT_S = 30.0
#: A GPU hotter than this (Celsius) gets no new jobs (`[node] max_gpu_temp_c`): below the
#: ~90 C where data-centre GPUs begin to throttle their clocks.
MAX_GPU_TEMP_C = 90.0
#: Cache keys (--cache-key) a GPU remembers as warm (`[node] cache_keys_per_gpu`): a GPU's
#: memory holds one or two large models, the host's page cache a few more.
CACHE_KEYS_PER_GPU = 4
#: Telemetry older than this (seconds, five heartbeats) is stale: placement ignores it
#: (`[head] telemetry_stale_s`).
TELEMETRY_STALE_S = 10.0
#: How often gqnode runs its `[node] health_check` program, and how long one run may take, in
#: seconds (Slurm kills its HealthCheckProgram after 60 s too).
HEALTH_CHECK_INTERVAL_S = 60.0
HEALTH_CHECK_TIMEOUT_S = 60.0
#: How often gqnode resends unacknowledged reports from its outbox, in seconds.
OUTBOX_RESEND_S = 2.0
#: A node whose state disk has less free than this, in bytes, takes no new jobs (drained until
#: it has this much again; its running jobs go on).
NODE_MIN_FREE_BYTES = 1024 * 1024
#: Disk reserved for each run's record when the run is created, in bytes: room for the lines
#: the record gets (pids, the final status with a note of up to 1,000 characters) on a disk
#: that has filled up meanwhile.
RUN_RECORD_RESERVE_BYTES = 8192
#: How long the CLI waits for a reply before it calls the head unreachable, in seconds.
CLIENT_TIMEOUT_S = 15.0
#: Endpoints gqd binds for the CLI ([head] client_endpoints): a local ipc socket and TCP.
HEAD_CLIENT_ENDPOINTS = ("ipc:///run/gq/gqd.sock", "tcp://127.0.0.1:6817")
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
#: Most nodes one job may ask for (`-N`), and most GPUs per node (`-g`).
MAX_NODES_PER_JOB = 64
MAX_GPUS_PER_NODE = 64
#: Most tasks one job may ask for (`-n`, and `--ntasks-per-node`), most CPUs per task or per
#: GPU (`-c`, `--cpus-per-gpu`), and the widest `--nice` (Slurm's).
MAX_TASKS = 1_000_000
MAX_CPUS = 2**20
MAX_NICE = 2_147_483_645
#: Longest time limit a job may name (`-t`), in seconds: ten years.
MAX_TIME_LIMIT_S = 10 * 365 * 86400
#: Most tasks one `--array` may have, and its highest index.
MAX_ARRAY_TASKS = 100_000
MAX_ARRAY_INDEX = 9_999_999
#: Requests a relay (`gq relay`, gqnode's for its jobs) holds for gqd, and replies for one
#: client, in messages: past it a new request is answered "try again" at once.
RELAY_QUEUE = 10_000
#: Name of gqnode's socket, in its state directory, on which it relays its jobs' requests.
NODE_RELAY_SOCKET = "gq.sock"
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

#: Job and node events ([head] events_keep_s, events_keep_rows): kept this long, in seconds,
#: and at most this many; gqd prunes older ones every EVENTS_PRUNE_S seconds.
EVENTS_KEEP_S = 7 * 86400.0
EVENTS_KEEP_ROWS = 1_000_000
EVENTS_PRUNE_S = 60.0
#: Events in one reply when the request names no limit, and the most one may name.
EVENTS_PAGE = 1000
MAX_EVENTS_PAGE = 10_000
#: Most events one `events` request looks through (past it the reply says where it got to):
#: a consumer far behind with a narrow filter cannot hold gqd's loop for a scan of them all.
MAX_EVENTS_SCAN = 50_000
#: How long `Client.events(follow=True)` waits before asking an unreachable head again, in s.
EVENTS_RETRY_S = 1.0
#: Longest an `events` or `wait` request is parked on the head, in seconds.
MAX_PARK_S = 300.0

#: API tokens: how long one lasts when `gq token create` names no --expires, and the longest
#: it may name, in seconds; the longest name, in characters; most tokens per user.
TOKEN_EXPIRES_S = 30 * 86400
MAX_TOKEN_EXPIRES_S = 3650 * 86400
MAX_TOKEN_NAME = 100
MAX_TOKENS_PER_USER = 100

#: gq api: where it serves HTTP; its largest request body, in bytes; most specs per submit and
#: jobs per listing page; requests per second per token, on average and in a burst; most
#: requests waiting for gqd at once; how often an idle event stream gets a keep-alive comment
#: and how long each of its requests is parked on gqd, in seconds; how often `output?follow=1`
#: looks for more output, in seconds.
API_LISTEN = "127.0.0.1:6821"
API_MAX_BODY_BYTES = 16 * 1024 * 1024
API_MAX_JOBS_PER_SUBMIT = 1000
API_MAX_PAGE = 1000
API_RATE_PER_S = 50.0
API_RATE_BURST = 200
API_MAX_IN_FLIGHT = 5000
API_EVENTS_PARK_S = 15.0
API_OUTPUT_POLL_S = 0.25

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
#: ... of a Slurm script (one with #SBATCH lines) or an `sbatch` call: Slurm's, with an
#: array's by its job id and index.
SLURM_OUTPUT = "slurm-%j.out"
SLURM_ARRAY_OUTPUT = "slurm-%A_%a.out"
#: GPUs per node of a `gq submit` job that asks for none in any form ([scheduler]
#: default_gpus); a Slurm script or an `sbatch` call that asks for none gets none.
DEFAULT_GPUS = 1
#: The one partition, holding every node, of a cluster whose config defines none (the name
#: most GPU clusters' scripts ask for).
DEFAULT_PARTITION = "gpu"
#: Slurm's ClusterName of a cluster whose config names none ([head] cluster_name).
CLUSTER_NAME = "gq"

#: Names of the files in gqd's state directory.
DB_FILE = "gq.db"
#: The personal cluster's config file under $XDG_STATE_HOME/gq.
PERSONAL_CONFIG = "gq.toml"
#: System-wide config.
SYSTEM_CONFIG = "/etc/gq/gq.toml"

#: Most processes and threads a job may have at once ([node] job_pids_max): far above what a
#: training job with its data-loader workers uses, far below what a fork bomb reaches.
JOB_PIDS_MAX = 16384
#: How long the shepherd waits for the processes of a job's cgroup to die of SIGKILL at its
#: end, and gqnode (whose loop must not stall) for those a dead shepherd left, in seconds.
CGROUP_KILL_TIMEOUT_S = 10.0
CGROUP_KILL_NODE_S = 1.0

#: [power] (gq/powercfg.py): seconds idle before a node is suspended, seconds a resumed node has
#: to register, seconds a suspend may take, nodes resumed a minute (Slurm's ResumeTimeout is
#: 60 s, SuspendTimeout 30 s, ResumeRate 300; cloud instances often boot in minutes).
POWER_SUSPEND_TIME_S = 600.0
POWER_RESUME_TIMEOUT_S = 300.0
POWER_SUSPEND_TIMEOUT_S = 30.0
POWER_RESUME_RATE = 300
