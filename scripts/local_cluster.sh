#!/usr/bin/env bash
# A Spark standalone cluster on this machine — one master on 127.0.0.1 and N workers — run
# from the pip-installed pyspark (its wheel ships bin/spark-class but not sbin/start-*.sh, so
# the daemons are started here directly, each with a pid file). With --hosts each worker acts
# as a host of its own: bound to its own loopback address and, with --separate-disks, with its
# own temporary, work and local directories (no file one writes is visible to another).
#
#   scripts/local_cluster.sh start [options]   start master + workers, print the master URL
#   scripts/local_cluster.sh status [--dir D]  show what runs and the master URL
#   scripts/local_cluster.sh stop [--dir D]    stop exactly the processes `start` started
#   scripts/local_cluster.sh replace-worker --host H [--dir D]
#                                              a new, empty machine on H's address: a fresh
#                                              worker (fresh directories) for one that died
#
# Options of start (defaults in brackets):
#   --workers N           workers [2]
#   --hosts A,B,...       one worker per address (127.x.y.z), instead of N on 127.0.0.1
#   --separate-disks      each worker (each host) gets its own TMPDIR, work and local dirs
#   --daemon-java-opts O  JVM options of the master and worker daemons [none]
#   --cores C             cores each worker offers [1]
#   --memory M            memory each worker offers to executors, e.g. 2g [1g]
#   --daemon-memory M     heap of the master and worker JVMs themselves [512m]
#   --port P              master port [7077]
#   --webui-port P        master web UI port; 0 picks a free one [8080]
#   --gpus-per-worker G   GPUs each worker offers (discovered with get_gpus_resources.sh) [0]
#   --dir D               state directory: pid files, logs, work dirs, master URL
#                         [$BIGDL_PY_CLUSTER_DIR or ${TMPDIR:-/tmp}/bigdl_py-cluster-$UID]
#   --timeout S           seconds to wait for the master and every worker to be up [90]
#
# Then, e.g.:
#   spark-submit --master "$(cat "$dir/master_url")" --conf spark.driver.host=127.0.0.1 job.py
set -euo pipefail

usage() { sed -n '2,31p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }

command_name="${1:-}"
[[ -n "$command_name" ]] || usage 2
shift

workers=2
cores=1
memory=1g
daemon_memory=512m
master_port=7077
webui_port=8080
gpus_per_worker=0
hosts=""
separate_disks=0
daemon_java_opts=""
replace_host=""
state_dir="${BIGDL_PY_CLUSTER_DIR:-${TMPDIR:-/tmp}/bigdl_py-cluster-$(id -u)}"
timeout_s=90

while [[ $# -gt 0 ]]; do
    case "$1" in
        --workers) workers="$2"; shift 2 ;;
        --cores) cores="$2"; shift 2 ;;
        --memory) memory="$2"; shift 2 ;;
        --daemon-memory) daemon_memory="$2"; shift 2 ;;
        --port) master_port="$2"; shift 2 ;;
        --webui-port) webui_port="$2"; shift 2 ;;
        --gpus-per-worker) gpus_per_worker="$2"; shift 2 ;;
        --hosts) hosts="$2"; shift 2 ;;
        --separate-disks) separate_disks=1; shift ;;
        --daemon-java-opts) daemon_java_opts="$2"; shift 2 ;;
        --host) replace_host="$2"; shift 2 ;;
        --dir) state_dir="$2"; shift 2 ;;
        --timeout) timeout_s="$2"; shift 2 ;;
        -h|--help) usage 0 ;;
        *) echo "local_cluster.sh: unknown option $1" >&2; usage 2 ;;
    esac
done

for number in workers cores master_port webui_port gpus_per_worker timeout_s; do
    [[ "${!number}" =~ ^[0-9]+$ ]] || {
        echo "local_cluster.sh: --${number//_/-} must be a whole number, got '${!number}'" >&2
        exit 2
    }
done

# One loopback address per worker: from --hosts, else 127.0.0.1 for each of --workers.
worker_hosts=()
if [[ -n "$hosts" ]]; then
    IFS=, read -r -a worker_hosts <<< "$hosts"
    for host in "${worker_hosts[@]}"; do
        [[ "$host" =~ ^127\.[0-9]+\.[0-9]+\.[0-9]+$ ]] || {
            echo "local_cluster.sh: --hosts takes loopback addresses (127.x.y.z), got '$host'" >&2
            exit 2
        }
    done
    workers=${#worker_hosts[@]}
else
    for _ in $(seq 1 "$workers"); do worker_hosts+=(127.0.0.1); done
fi

repo_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
pid_dir="$state_dir/pids"
log_dir="$state_dir/logs"
master_url="spark://127.0.0.1:$master_port"

alive() { [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

# A pid file is trusted only while its process is still the Spark daemon we started: after a
# reboot or a crash the number may belong to something else, which must never be killed.
is_our_daemon() {
    local pid
    pid="$(cat "$1")"
    kill -0 "$pid" 2>/dev/null && tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null \
        | grep -q "org.apache.spark.deploy.$2"
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

find_spark_home() {
    local python="${PYSPARK_PYTHON:-python3}"
    command -v "$python" >/dev/null || python=python
    SPARK_HOME="$("$python" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')" || {
        echo "local_cluster.sh: cannot import pyspark with $python; install it (pip install pyspark)" >&2
        exit 1
    }
    export SPARK_HOME
    export PYSPARK_PYTHON="${PYSPARK_PYTHON:-$(command -v "$python")}"
    command -v java >/dev/null || [[ -n "${JAVA_HOME:-}" ]] || {
        echo "local_cluster.sh: no java on PATH and JAVA_HOME unset; Spark needs Java 17 or 21" >&2
        exit 1
    }
}

# start_daemon NAME CLASS ARGS...: run spark-class in its own session, pid written by itself
# (so the file holds the JVM's pid whether or not setsid had to fork).
start_daemon() {
    local name="$1"; shift
    local pid_file="$pid_dir/$name.pid"
    rm -f "$pid_file"  # a dead daemon's (replace-worker): wait for the new one's below
    setsid bash -c 'echo $$ > "$0"; exec "$@"' "$pid_file" \
        "$SPARK_HOME/bin/spark-class" "$@" > "$log_dir/$name.log" 2>&1 < /dev/null &
    local waited=0
    until [[ -s "$pid_file" ]]; do
        sleep 0.1
        waited=$((waited + 1))
        [[ $waited -lt 100 ]] || { echo "local_cluster.sh: $name did not start" >&2; return 1; }
    done
}

# wait_for WHAT PID_FILE LOG PATTERN: until PATTERN is in LOG, the daemon alive, or timeout.
wait_for() {
    local what="$1" pid_file="$2" log="$3" pattern="$4" deadline=$((SECONDS + timeout_s))
    until grep -q "$pattern" "$log" 2>/dev/null; do
        if ! alive "$pid_file"; then
            echo "local_cluster.sh: $what exited during start-up; end of $log:" >&2
            tail -n 30 "$log" >&2
            return 1
        fi
        if [[ $SECONDS -ge $deadline ]]; then
            echo "local_cluster.sh: $what not ready after ${timeout_s}s (see $log)" >&2
            return 1
        fi
        sleep 0.5
    done
}

stop_cluster() {
    [[ -d "$pid_dir" ]] || { echo "no cluster state in $state_dir"; return 0; }
    local pid_file name class pid
    # Workers first: each stops its executors; then the master.
    for pid_file in "$pid_dir"/worker-*.pid "$pid_dir"/master.pid; do
        [[ -f "$pid_file" ]] || continue
        name="$(basename "$pid_file" .pid)"
        class=worker.Worker
        [[ "$name" == master ]] && class=master.Master
        if is_our_daemon "$pid_file" "$class"; then
            pid="$(cat "$pid_file")"
            kill "$pid"
            for _ in $(seq 1 100); do
                kill -0 "$pid" 2>/dev/null || break
                sleep 0.1
            done
            kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
            echo "stopped $name (pid $pid)"
        else
            echo "$name was not running"
        fi
        rm -f "$pid_file"
    done
    rm -f "$state_dir/master_url" "$pid_dir"/*.host
}

# start_worker INDEX HOST: worker INDEX bound to HOST. With separate disks every start is a
# new machine: fresh tmp, work and local directories that no earlier worker there used
# (executors inherit the worker's environment, so their Python workers write under its TMPDIR).
start_worker() {
    local index="$1" host="$2" work_dir log="$log_dir/worker-$1.log"
    [[ -f "$log" ]] && mv "$log" "$log.previous"
    echo "$host" > "$pid_dir/worker-$index.host"
    (
        export SPARK_LOCAL_IP="$host"
        if [[ "$separate_disks" -eq 1 ]]; then
            local machine=0 base="$state_dir/hosts/worker-$index"
            while [[ -e "$base/machine-$machine" ]]; do machine=$((machine + 1)); done
            mkdir -p "$base/machine-$machine"/{tmp,work,local}
            export TMPDIR="$base/machine-$machine/tmp"
            export SPARK_LOCAL_DIRS="$base/machine-$machine/local"
            work_dir="$base/machine-$machine/work"
        else
            work_dir="$state_dir/work/worker-$index"
        fi
        start_daemon "worker-$index" org.apache.spark.deploy.worker.Worker \
            --host "$host" --port 0 --webui-port 0 --cores "$cores" --memory "$memory" \
            --work-dir "$work_dir" "$master_url"
    )
}

wait_for_worker() {
    wait_for "worker-$1" "$pid_dir/worker-$1.pid" "$log_dir/worker-$1.log" \
        "Successfully registered with master"
}

# The daemons' environment, the same for start and replace-worker.
daemon_environment() {
    export SPARK_DAEMON_MEMORY="$daemon_memory"
    export SPARK_LOG_DIR="$log_dir"
    [[ -z "$daemon_java_opts" ]] || export SPARK_DAEMON_JAVA_OPTS="$daemon_java_opts"
    if [[ "$gpus_per_worker" -gt 0 ]]; then
        export SPARK_WORKER_OPTS="${SPARK_WORKER_OPTS:-} \
-Dspark.worker.resource.gpu.amount=$gpus_per_worker \
-Dspark.worker.resource.gpu.discoveryScript=$repo_dir/scripts/get_gpus_resources.sh"
    fi
}

start_cluster() {
    find_spark_home
    if [[ -f "$pid_dir/master.pid" ]] && is_our_daemon "$pid_dir/master.pid" master.Master; then
        echo "local_cluster.sh: a cluster from $state_dir is running already; stop it first" >&2
        exit 1
    fi
    if port_open "$master_port"; then
        echo "local_cluster.sh: port $master_port on 127.0.0.1 is in use; pick another with --port" >&2
        exit 1
    fi
    mkdir -p "$pid_dir" "$log_dir" "$state_dir/work"
    rm -f "$pid_dir"/*.pid "$pid_dir"/*.host
    # What replace-worker needs to start a worker like these.
    declare -p cores memory daemon_memory daemon_java_opts separate_disks gpus_per_worker \
        master_url > "$state_dir/cluster.settings"

    # The master binds to 127.0.0.1; each worker to its host's address (RPC, block manager,
    # web UIs), so executors on different "hosts" talk over different addresses.
    daemon_environment
    ( export SPARK_LOCAL_IP=127.0.0.1
      start_daemon master org.apache.spark.deploy.master.Master \
          --host 127.0.0.1 --port "$master_port" --webui-port "$webui_port" )
    wait_for master "$pid_dir/master.pid" "$log_dir/master.log" "Starting Spark master at" || {
        stop_cluster >/dev/null; exit 1; }
    for index in $(seq 1 "$workers"); do
        start_worker "$index" "${worker_hosts[$((index - 1))]}"
    done
    for index in $(seq 1 "$workers"); do
        wait_for_worker "$index" || { stop_cluster >/dev/null; exit 1; }
    done
    echo "$master_url" > "$state_dir/master_url"
    local ui
    ui="$(grep -o 'http://[^ ]*' "$log_dir/master.log" | head -n 1 || true)"
    echo "master: $master_url (web UI ${ui:-unknown}); $workers worker(s) x $cores core(s), $memory"
    [[ -z "$hosts" ]] || echo "hosts: $hosts$([[ $separate_disks -eq 1 ]] && echo ', separate disks')"
    echo "state and logs: $state_dir"
    echo "$master_url"
}

replace_worker() {
    [[ -n "$replace_host" ]] || { echo "local_cluster.sh: replace-worker needs --host H" >&2; exit 2; }
    [[ -f "$state_dir/cluster.settings" ]] || {
        echo "local_cluster.sh: no cluster started from $state_dir" >&2; exit 1; }
    find_spark_home
    # shellcheck disable=SC1091  # written by start_cluster
    source "$state_dir/cluster.settings"
    local host_file index=""
    for host_file in "$pid_dir"/worker-*.host; do
        [[ -f "$host_file" && "$(cat "$host_file")" == "$replace_host" ]] || continue
        index="$(basename "$host_file" .host)"
        index="${index#worker-}"
    done
    [[ -n "$index" ]] || { echo "local_cluster.sh: no worker of this cluster on $replace_host" >&2; exit 1; }
    if is_our_daemon "$pid_dir/worker-$index.pid" worker.Worker; then
        echo "local_cluster.sh: worker-$index on $replace_host still runs; only a dead one is replaced" >&2
        exit 1
    fi
    daemon_environment
    start_worker "$index" "$replace_host"
    wait_for_worker "$index" || exit 1
    echo "worker-$index: a new machine on $replace_host (pid $(cat "$pid_dir/worker-$index.pid"))"
}

status_cluster() {
    [[ -d "$pid_dir" ]] || { echo "no cluster state in $state_dir"; return 1; }
    local running=0 pid_file name class
    for pid_file in "$pid_dir"/master.pid "$pid_dir"/worker-*.pid; do
        [[ -f "$pid_file" ]] || continue
        name="$(basename "$pid_file" .pid)"
        class=worker.Worker
        [[ "$name" == master ]] && class=master.Master
        if is_our_daemon "$pid_file" "$class"; then
            echo "$name: running (pid $(cat "$pid_file"))"
            running=$((running + 1))
        else
            echo "$name: not running"
        fi
    done
    if [[ $running -eq 0 ]]; then
        echo "no cluster running (state in $state_dir)"
        return 1
    fi
    [[ -f "$state_dir/master_url" ]] && echo "master URL: $(cat "$state_dir/master_url")"
    return 0
}

case "$command_name" in
    start) start_cluster ;;
    stop) stop_cluster ;;
    status) status_cluster ;;
    replace-worker) replace_worker ;;
    -h|--help|help) usage 0 ;;
    *) echo "local_cluster.sh: unknown command '$command_name' (start|stop|status|replace-worker)" >&2; usage 2 ;;
esac
