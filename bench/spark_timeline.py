"""Where a training job's time goes, read from Spark's event log.

    python bench/spark_timeline.py EVENT_LOG [--skip 20] [--match "bigdl_py iteration"]

Spark writes every job, stage and task with its clocks and metrics to the event log
(``spark.eventLog.enabled``; ``bench/time_to_accuracy.py --event-logs DIR`` keeps one per
contender, uncompressed). For the jobs whose description starts with ``--match`` (the
training chains: ``bigdl_py iteration ...`` / ``bigdl_py iterations a-b ...``) after the
first ``--skip`` of them, this prints the median milliseconds per job of each phase, on
the JVMs' clocks (all on one machine here):

* ``to_first_launch`` — the job's submission to its first task's launch: the DAG
  scheduler, building the stage's tasks and serialising them, finding a slot (locality
  waits included);
* per stage: ``deserialize`` (the executor deserialising the task: its closure, which holds
  the pickled Python function and whatever it captured), ``run`` (the executor running the
  task: a Python worker taken from the pool or forked, our Python code, reading its input
  from the cache or a shuffle, writing its shuffle output or result), ``shuffle_write`` and
  ``fetch_wait`` (parts of ``run``), ``scheduler_delay`` (launch to finish less the above:
  sending the task, its status update back, the result's bytes), each the slowest task's;
  and ``gap`` — the previous stage's last task finishing to this stage's first launch (the
  stage boundary: map outputs registered, the next stage submitted and its tasks placed);
* ``to_job_end`` — the last task finishing to the job's end event;
* ``job`` — submission to end; ``locality`` — how the tasks were placed, and how many
  waited a second or more between their stage's submission and their launch.

The driver's own part (Python building the job, py4j, collect()'s result reaching Python)
is the driver's wall time of the job less ``job``: ``time_to_accuracy.py`` prints both.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter, defaultdict

MATCH = "bigdl_py iteration"


def read_events(path: str) -> list[dict]:
    with open(path) as handle:
        return [json.loads(line) for line in handle if line.strip()]


def iterations_in(description: str) -> int:
    """``bigdl_py iterations 5-20: ...`` holds 16 iterations; ``iteration 5`` one."""
    words = description.split(":")[0].split()
    if len(words) >= 3 and words[1] == "iterations" and "-" in words[2]:
        first, last = words[2].split("-")
        return int(last) - int(first) + 1
    return 1


def job_timelines(events: list[dict], match: str = MATCH) -> list[dict]:
    """The matching jobs in order, each with its stages and their tasks' clocks and metrics."""
    jobs, stage_job, stages = {}, {}, defaultdict(dict)
    for event in events:
        kind = event["Event"]
        if kind == "SparkListenerJobStart":
            description = (event.get("Properties") or {}).get("spark.job.description") or ""
            if description.startswith(match):
                jobs[event["Job ID"]] = {
                    "description": description,
                    "submitted": event["Submission Time"],
                    "stages": [],
                }
                for stage_id in event["Stage IDs"]:
                    stage_job[stage_id] = event["Job ID"]
        elif kind == "SparkListenerJobEnd" and event["Job ID"] in jobs:
            jobs[event["Job ID"]]["ended"] = event["Completion Time"]
            jobs[event["Job ID"]]["result"] = event["Job Result"]["Result"]
        elif kind == "SparkListenerStageSubmitted" and event["Stage Info"]["Stage ID"] in stage_job:
            info = event["Stage Info"]
            stage = stages[info["Stage ID"]]
            stage.update(id=info["Stage ID"], submitted=info.get("Submission Time"), tasks=[])
            jobs[stage_job[info["Stage ID"]]]["stages"].append(stage)
        elif kind == "SparkListenerTaskEnd" and event["Stage ID"] in stage_job:
            info, metrics = event["Task Info"], event.get("Task Metrics") or {}
            stages[event["Stage ID"]].setdefault("tasks", []).append(
                {
                    "launched": info["Launch Time"],
                    "finished": info["Finish Time"],
                    "locality": info["Locality"],
                    "host": info["Host"],
                    "deserialize": metrics.get("Executor Deserialize Time", 0),
                    "run": metrics.get("Executor Run Time", 0),
                    "result_serialize": metrics.get("Result Serialization Time", 0),
                    "getting_result": info.get("Getting Result Time", 0) or 0,
                    "shuffle_write": (metrics.get("Shuffle Write Metrics") or {}).get(
                        "Shuffle Write Time", 0
                    )
                    / 1e6,
                    "fetch_wait": (metrics.get("Shuffle Read Metrics") or {}).get(
                        "Fetch Wait Time", 0
                    ),
                    "succeeded": event["Task End Reason"]["Reason"] == "Success",
                }
            )
    return [job for _, job in sorted(jobs.items()) if "ended" in job]


def phases(job: dict) -> dict:
    """One job's phases in ms (see the module docstring); stage phases keyed ``stage{i}.``."""
    result = {"job": job["ended"] - job["submitted"]}
    stages = [stage for stage in job["stages"] if stage.get("tasks")]
    previous_finish = None
    for number, stage in enumerate(stages):
        tasks = stage["tasks"]
        first_launch = min(task["launched"] for task in tasks)
        if previous_finish is None:
            result["to_first_launch"] = first_launch - job["submitted"]
        else:
            result[f"stage{number}.gap"] = first_launch - previous_finish
        for name in ("deserialize", "run", "shuffle_write", "fetch_wait"):
            result[f"stage{number}.{name}"] = max(task[name] for task in tasks)
        result[f"stage{number}.scheduler_delay"] = max(
            task["finished"]
            - task["launched"]
            - task["deserialize"]
            - task["run"]
            - task["result_serialize"]
            - task["getting_result"]
            for task in tasks
        )
        previous_finish = max(task["finished"] for task in tasks)
    result["to_job_end"] = job["ended"] - previous_finish
    return result


def locality(jobs: list[dict]) -> tuple[Counter, int]:
    """How the jobs' tasks were placed, and how many launched 1 s or more after their
    stage's submission (a locality wait: ``spark.locality.wait`` is 3 s by default)."""
    levels, waited = Counter(), 0
    for job in jobs:
        for stage in job["stages"]:
            for task in stage.get("tasks", []):
                levels[task["locality"]] += 1
                if stage.get("submitted") and task["launched"] - stage["submitted"] >= 1000:
                    waited += 1
    return levels, waited


def summary(path: str, skip: int = 20, match: str = MATCH) -> dict:
    """Median phases (ms per job and per iteration) of the matching jobs after ``skip``."""
    jobs = job_timelines(read_events(path), match)[skip:]
    if not jobs:
        return {"jobs": 0}
    rows = [phases(job) for job in jobs]
    names = sorted({name for row in rows for name in row})
    medians = {name: statistics.median(row[name] for row in rows if name in row) for name in names}
    iterations = statistics.median(iterations_in(job["description"]) for job in jobs)
    levels, waited = locality(jobs)
    return {
        "jobs": len(jobs),
        "iterations_per_job": iterations,
        "stages_per_job": statistics.median(len(job["stages"]) for job in jobs),
        "median_ms_per_job": medians,
        "locality": dict(levels),
        "tasks_waiting_1s_or_more": waited,
    }


def format_summary(result: dict) -> str:
    if not result["jobs"]:
        return "no matching jobs in the event log"
    per_job = result["median_ms_per_job"]
    lines = [
        f"{result['jobs']} jobs, {result['iterations_per_job']:g} iterations and "
        f"{result['stages_per_job']:g} stages each; locality {result['locality']}, "
        f"{result['tasks_waiting_1s_or_more']} tasks launched >= 1 s after their stage",
        "median ms per job: " + ", ".join(f"{name} {value:.1f}" for name, value in per_job.items()),
    ]
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("event_log")
    parser.add_argument("--skip", type=int, default=20)
    parser.add_argument("--match", default=MATCH)
    arguments = parser.parse_args(argv)
    print(format_summary(summary(arguments.event_log, arguments.skip, arguments.match)))


if __name__ == "__main__":
    main()
