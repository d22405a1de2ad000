"""``scripts/local_cluster.sh`` from Python: a standalone cluster on this machine, as a context.

The shell script is the one implementation (start, stop, replace a dead worker); this wraps
it for the Python that needs a cluster for a while — ``bench/time_to_accuracy.py --cluster``
and the separate-hosts test (``tests/spark/separate_hosts_job.py``) — so both measure and
test on the same two-host cluster::

    with LocalCluster(directory, hosts=TWO_HOSTS) as cluster:
        spark = get_spark(cluster.url, conf=cluster.session_conf())
"""

from __future__ import annotations

import os
import socket
import subprocess

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "local_cluster.sh")
#: The issue's two hosts: one 1-core worker each, each with its own disk.
TWO_HOSTS = ("127.0.0.2", "127.0.0.3")


def free_port() -> int:
    """A TCP port nobody listens on at 127.0.0.1 now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class LocalCluster:
    """A master on 127.0.0.1 and one worker per address of ``hosts``, each with its own
    temporary, work and local directories (``--separate-disks``) under ``directory``.

    Parameters
    ----------
    directory : str
        The script's state directory (pid files, logs, the workers' directories).
    hosts : sequence of str
        Loopback addresses, one worker each.
    cores, memory : int, str
        What each worker offers.
    daemon_java_opts : str
        JVM options of the master and worker daemons.
    """

    def __init__(
        self,
        directory: str,
        hosts=TWO_HOSTS,
        cores: int = 1,
        memory: str = "1g",
        daemon_java_opts: str = "",
    ):
        self.directory = directory
        self.hosts = tuple(hosts)
        self.cores = int(cores)
        self.memory = memory
        self.daemon_java_opts = daemon_java_opts
        self.port = free_port()
        self.url = f"spark://127.0.0.1:{self.port}"

    def _script(self, *arguments: str) -> str:
        completed = subprocess.run(
            [SCRIPT, *arguments, "--dir", self.directory],
            capture_output=True,
            text=True,
            timeout=300,
            stdin=subprocess.DEVNULL,
        )
        if completed.returncode != 0:
            raise RuntimeError(
                f"local_cluster.sh {arguments[0]} failed: {completed.stderr[-2000:]}"
            )
        return completed.stdout

    def start(self) -> LocalCluster:
        arguments = ["--hosts", ",".join(self.hosts), "--separate-disks"]
        arguments += ["--cores", str(self.cores), "--memory", self.memory]
        arguments += ["--port", str(self.port), "--webui-port", "0"]
        if self.daemon_java_opts:
            arguments += ["--daemon-java-opts", self.daemon_java_opts]
        self._script("start", *arguments)
        return self

    def worker_pid(self, host: str) -> int:
        """The process id of the worker daemon that runs on ``host`` now."""
        pids = os.path.join(self.directory, "pids")
        for name in sorted(os.listdir(pids)):
            if not name.endswith(".host"):
                continue
            with open(os.path.join(pids, name)) as address:
                if address.read().strip() != host:
                    continue
            with open(os.path.join(pids, name[: -len(".host")] + ".pid")) as pid:
                return int(pid.read())
        raise RuntimeError(f"no worker of the cluster in {self.directory} runs on {host}")

    def replace_worker(self, host: str) -> None:
        """A new, empty machine on ``host``'s address, in place of a worker that died."""
        self._script("replace-worker", "--host", host)

    def stop(self) -> None:
        self._script("stop")

    def session_conf(self) -> dict[str, str]:
        """What a SparkSession on this cluster sets: the driver's address (the workers'
        loopback addresses reach 127.0.0.1), executors the size of a worker, all of them."""
        return {
            "spark.driver.host": "127.0.0.1",
            "spark.executor.cores": str(self.cores),
            "spark.cores.max": str(self.cores * len(self.hosts)),
        }

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()
