"""docker-compose.yaml cannot run here (no Docker engine), so its structure is checked:
every service the stack needs, the repository mounted, nothing pointing at a file that
does not exist, Airflow wired to its database, trailbound's connections and Spark."""

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((REPO / "docker-compose.yaml").read_text())
AIRFLOW = ("airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer")


def test_the_stack_has_every_service():
    expected = {"airflow-db", "trailbound-db", "spark-master", "spark-worker", "spark-connect", "airflow-init",
                *AIRFLOW}
    assert expected <= set(COMPOSE["services"])


def test_airflow_services_mount_the_repo_and_know_where_everything_is():
    for name in (*AIRFLOW, "airflow-init"):
        service = COMPOSE["services"][name]
        assert "./:/opt/trailbound" in service["volumes"], name
        env = service["environment"]
        assert env["AIRFLOW__CORE__DAGS_FOLDER"] == "/opt/trailbound/dags"
        assert env["AIRFLOW__CORE__PLUGINS_FOLDER"] == "/opt/trailbound/plugins"
        assert "@airflow-db/" in env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
        assert env["AIRFLOW_CONN_SPARK_DEFAULT"] == "spark://spark-master:7077"
        assert "@trailbound-db:5432/trailbound_meta" in env["AIRFLOW_CONN_TRAILBOUND_METADATA"]
        config = Path(env["TRAILBOUND_CONFIG"].replace("/opt/trailbound", str(REPO)))
        assert config.is_file(), "the configuration the containers use is in the repository"
    assert COMPOSE["services"]["airflow-scheduler"]["depends_on"]["airflow-init"]["condition"] == \
        "service_completed_successfully"


def test_spark_worker_joins_the_master_and_files_referenced_exist():
    worker = COMPOSE["services"]["spark-worker"]
    assert "spark://spark-master:7077" in worker["command"]
    build = COMPOSE["services"]["airflow-scheduler"]["build"]
    assert (REPO / build["context"] / build["dockerfile"]).is_file()
    for service in COMPOSE["services"].values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (REPO / source).exists(), volume


def test_databases_are_health_checked_before_airflow_starts():
    for name in ("airflow-db", "trailbound-db"):
        assert "pg_isready" in COMPOSE["services"][name]["healthcheck"]["test"]
    assert COMPOSE["services"]["airflow-scheduler"]["depends_on"]["trailbound-db"]["condition"] == "service_healthy"


def test_airflow_reaches_a_spark_connect_server_on_the_cluster_that_imports_trailbound():
    import json

    server = COMPOSE["services"]["spark-connect"]
    command = server["command"]
    assert "org.apache.spark.sql.connect.service.SparkConnectServer" in command
    assert command[command.index("--master") + 1] == "spark://spark-master:7077"
    port = next(c.split("=")[1] for c in command if c.startswith("spark.connect.grpc.binding.port="))
    assert "./:/opt/trailbound" in server["volumes"]
    assert server["environment"]["PYTHONPATH"] == "/opt/trailbound/include"
    assert "spark.executorEnv.PYTHONPATH=/opt/trailbound/include" in command
    assert (REPO / "include" / "trailbound" / "__init__.py").is_file()
    for name in AIRFLOW:
        connection = json.loads(COMPOSE["services"][name]["environment"]["AIRFLOW_CONN_SPARK_CONNECT_DEFAULT"])
        assert connection == {"conn_type": "spark_connect", "host": "spark-connect", "port": int(port)}
