"""What a failed Spark job's error says to the user (``partitioned_data.python_error_text``)."""

from bigdl_py.spark.partitioned_data import python_error_text

SPARK_FAILURE = (
    "An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.\n"
    ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 1 in stage 32.0 "
    "failed 4 times, most recent failure: Lost task 1.3 in stage 32.0 (TID 70) (192.0.2.2 "
    "executor 4): ExecutorLostFailure (executor 4 exited caused by one of the running tasks) "
    "Reason: Command exited with code {code}\n"
    "Driver stacktrace:\n"
    "\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages"
    "(DAGScheduler.scala:2935)\n"
)
PYTHON_FAILURE = (
    "An error occurred while calling o123.collect.\n"
    ": org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
    '  File "worker.py", line 1, in process\n'
    "ValueError: shape (3, 4) does not match the model's input (3, 5)\n"
    "\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException"
    "(PythonRunner.scala:572)\n"
)


def test_a_python_error_inside_the_task_is_what_the_user_reads():
    text = python_error_text(RuntimeError(PYTHON_FAILURE))
    assert text == "ValueError: shape (3, 4) does not match the model's input (3, 5)"


def test_an_executor_out_of_memory_is_said_in_words_with_what_to_change():
    text = python_error_text(RuntimeError(SPARK_FAILURE.format(code=52)))
    assert text.startswith("an executor ran out of memory")
    assert "Command exited with code 52" in text
    assert "spark.executor.memory" in text and "Pipeline" in text


def test_another_lost_executor_gives_sparks_reason():
    text = python_error_text(RuntimeError(SPARK_FAILURE.format(code=137)))
    assert text == "an executor was lost: Command exited with code 137"
    # 520 is not 52: the code is matched whole.
    assert "out of memory" not in python_error_text(RuntimeError(SPARK_FAILURE.format(code=520)))


def test_a_job_spark_aborted_gives_sparks_message_not_py4js():
    failure = (
        "An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.\n"
        ": org.apache.spark.SparkException: Job aborted due to stage failure: Master removed our "
        "application: FAILED\n\tat org.apache.spark.scheduler.DAGScheduler.abortStage"
        "(DAGScheduler.scala:2900)\n"
    )
    assert python_error_text(RuntimeError(failure)) == (
        "Job aborted due to stage failure: Master removed our application: FAILED"
    )


def test_anything_else_keeps_its_first_line():
    assert python_error_text(RuntimeError("first line\nsecond")) == "first line"
