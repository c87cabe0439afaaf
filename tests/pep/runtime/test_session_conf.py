"""The gateway's Spark settings and an operator's own (no Spark started)."""
from pep.runtime.session import DEFAULT_CONF, JAVA_OPTIONS, session_conf


def test_defaults_compile_with_c1_and_keep_the_stack_size() -> None:
    conf = session_conf()
    assert conf == DEFAULT_CONF
    options = conf["spark.driver.extraJavaOptions"].split()
    assert "-XX:TieredStopAtLevel=1" in options and "-Xss16m" in options


def test_an_operators_java_options_follow_the_gateways_own() -> None:
    conf = session_conf({"spark.driver.extraJavaOptions": " -XX:TieredStopAtLevel=4 ",
                         "spark.sql.shuffle.partitions": "4"})
    options = conf["spark.driver.extraJavaOptions"]
    # the stack size the queries need stays; the flag given again comes last, and the JVM
    # takes the last one
    assert options.startswith(JAVA_OPTIONS)
    assert options.split()[-1] == "-XX:TieredStopAtLevel=4"
    assert conf["spark.sql.shuffle.partitions"] == "4"
    assert DEFAULT_CONF["spark.driver.extraJavaOptions"] == JAVA_OPTIONS  # not changed in place
