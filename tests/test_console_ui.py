"""The operator's console in Airflow, for real: the suite starts Airflow's API server (with
our plugin), scheduler and triggerer on 127.0.0.1 and
- drives headless Chromium (Debian's chromium and chromium-driver, through selenium)
  through the login and the navigation to the console, the plugin's React app inside
  Airflow's UI, and reads what a user reads there, at a wide and a narrow window
  (screenshots are kept; their paths are printed);
- runs the long-transaction monitor, whose sensor defers to the triggerer, polls every
  WARNLONGTRANS CHECKINTERVAL, and alerts through our notifier into a user's notifier."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import time
import urllib.error
import urllib.request
from datetime import timedelta
from pathlib import Path

import pytest

from capture_kit import T0, ins, new_archive, rec
from process_kit import stop_process_groups
from test_dags import REPO, VENV_BIN, AirflowWorld, free_port, start_api_server
from trailbound import cli

pytestmark = [pytest.mark.spark, pytest.mark.pg]

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
USER, PASSWORD = "operator", "operator-password-for-the-test"
WIDE, NARROW = (1400, 900), (480, 900)
ARTIFACTS = REPO / "var" / "artifacts"


def write_config(tmp_path: Path) -> Path:
    path = tmp_path / "trailbound.yaml"
    path.write_text(f"home: {tmp_path}\nsources:\n  SRC:\n    altarchivelogdest: archive\n"
                    "extracts:\n  EXT1:\n    source: SRC\n    exttrail: dirdat/lt\n    table: ['shop.*']\n"
                    "    warnlongtrans:\n      duration: 1h\n      checkinterval: 3s\n"
                    "replicats:\n  REP1:\n    exttrail: dirdat/lt\n    source: SRC\n"
                    f"airflow:\n  start_date: {T0.isoformat()}\n  alert_notifiers: [pager.pager]\n")
    # A user's own notifier (as a SlackNotifier would be configured), writing what it sends.
    (tmp_path / "pager.py").write_text(
        "from pathlib import Path\nfrom airflow.sdk import BaseNotifier\n\n"
        "class FilePager(BaseNotifier):\n    template_fields = ('text',)\n\n"
        "    def __init__(self, text):\n        super().__init__()\n        self.text = text\n\n"
        "    def notify(self, context):\n"
        "        with open(Path(__file__).with_name('pages.txt'), 'a') as pages:\n"
        "            pages.write(self.text + '\\n')\n\n"
        "pager = FilePager(text='{{ trailbound_alert }}')\n")
    return path


def task_state(world: AirflowWorld, dag_id: str) -> str | None:
    with sqlite3.connect(world.home / "airflow.db") as airflow_db:
        row = airflow_db.execute("SELECT state FROM task_instance WHERE dag_id = ? ORDER BY start_date DESC",
                                 (dag_id,)).fetchone()
    return row[0] if row else None


def trigger_log(world: AirflowWorld) -> str:
    """What the monitor's trigger logged (the triggerer writes it beside the task's log)."""
    return "".join(path.read_text() for path in (world.home / "logs").glob("dag_id=longtrans_ext1/**/*.trigger.*"))


def wait_for(condition, what: str, logs: list[Path], seconds: int = 300):
    deadline = time.monotonic() + seconds
    while not (found := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}\n" + "\n".join(
            f"== {log}\n{log.read_text()[-2500:]}" for log in logs)
        time.sleep(2)
    return found


def status_of(url: str, token: str | None = None) -> int:
    """The HTTP status of a GET, redirects not followed."""
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.build_opener(NoRedirect, urllib.request.ProxyHandler({})).open(request,
                                                                                           timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except urllib.error.URLError:
        return 0  # not listening (yet)


class Airflow:
    """The API server (with our plugin), the scheduler and the triggerer of one world."""

    def __init__(self, world: AirflowWorld, directory: Path):
        self.logs = {name: directory / f"{name}.log" for name in ("api-server", "scheduler", "triggerer")}
        world.env.update({"AIRFLOW__API__WORKERS": "1",
                          "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
                          "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
                          "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False", "AIRFLOW__CORE__PARALLELISM": "2",
                          # A task's calls to the API server wait 5 s by default, then it is
                          # killed after the retries: on a loaded machine the API server's
                          # first answer to a task can take a minute.
                          "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "90"})
        server, self.port = start_api_server(world.env, self.logs["api-server"])
        self.url = f"http://127.0.0.1:{self.port}"
        self.processes = [server] + [subprocess.Popen([str(VENV_BIN / "airflow"), name], env=world.env,
                                                      stdout=open(self.logs[name], "w"), stderr=subprocess.STDOUT,
                                                      start_new_session=True) for name in ("scheduler", "triggerer")]
        try:
            wait_for(lambda: status_of(f"{self.url}/api/v2/monitor/health") == 200, "the API server",
                     [self.logs["api-server"]], seconds=240)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        stop_process_groups(self.processes)


def browser(profile: Path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--window-size={WIDE[0]},{WIDE[1]}", f"--user-data-dir={profile}"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def keep_screenshot(driver, tmp_path: Path, name: str) -> Path:
    """A screenshot under the test's tmp dir, copied to var/artifacts (kept after the run)."""
    shot = tmp_path / name
    driver.save_screenshot(str(shot))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    kept = Path(shutil.copy(shot, ARTIFACTS / name))
    print(f"screenshot of the console: {kept}")
    return kept


def chart(driver, charts: str, group: str):
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, f"#{charts} .tb-chart-card[data-group='{group}']")


def group_row(driver, group: str) -> dict:
    # One script reads every cell: read one WebDriver call at a time, a refresh landing
    # between two calls tears the row (a new checkpoint beside the old lag).
    cells = driver.execute_script(
        "const row = document.querySelector(`#info-all-table tr[data-group='${arguments[0]}']`);"
        "return row ? Array.from(row.querySelectorAll('td'), (td) => td.innerText.trim()) : null;", group)
    assert cells is not None, f"no row for {group} in INFO ALL"
    return dict(zip(["program", "status", "group", "lag", "since", "checkpoint", "error", "dags"], cells))


@pytest.mark.long_running(240)
@pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER), reason="needs Debian's chromium and chromium-driver "
                                                             "(the Makefile's set-up installs them)")
def test_an_operator_reads_the_view_in_a_browser_and_the_deferred_monitor_alerts_through_the_triggerer(
        tmp_path, spark, store, monkeypatch, spark_remote):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as until
    from selenium.webdriver.support.ui import WebDriverWait

    archive = new_archive(tmp_path)
    archive.segment(1, [ins(10, "OLDTX", 1), ins(20, "A", 2), rec(30, "A", "COMMIT")], 7200)
    config_path = write_config(tmp_path)
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", store.connection.dsn)
    monkeypatch.delenv("TRAILBOUND_TARGET_DSN", raising=False)
    # Runs as the capture DAG's tasks start them: each names its own DAG run.
    first_run, second_run = "scheduled__2026-11-01T02:00:00+00:00", "scheduled__2026-11-01T04:00:00+00:00"
    assert cli.main(["--config", str(config_path), "extract", "run", "EXT1", "--airflow-run", "capture_ext1",
                     first_run]) == 0
    assert cli.main(["--config", str(config_path), "replicat", "run", "REP1"]) == 1  # no target database

    world = AirflowWorld(tmp_path, config_path, store.connection.dsn, "", spark_remote)
    passwords = tmp_path / "passwords.json"
    passwords.write_text(json.dumps({USER: PASSWORD}))
    world.env.update({"AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:viewer",
                      "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords)})
    world.env.pop("TRAILBOUND_TARGET_DSN", None)
    world.airflow("dags", "reserialize")
    world.airflow("dags", "unpause", "longtrans_ext1")
    airflow = Airflow(world, tmp_path)
    logs = list(airflow.logs.values())
    try:
        driver = browser(tmp_path / "chromium-profile")
    except BaseException:
        airflow.stop()
        raise
    try:
        # Without a session the console's data and code answer 401; the old page's address
        # sends to the console in the UI (whose login is Airflow's).
        assert status_of(f"{airflow.url}/trailbound/") == 307
        for path in ("api/console", "api/info-all", "static/console.js", "metrics"):   # no redirect for a scraper
            assert status_of(f"{airflow.url}/trailbound/{path}") == 401, path
            assert status_of(f"{airflow.url}/trailbound/{path}", token="not-a-token") in (401, 403), path

        driver.get(f"{airflow.url}/")
        wait = WebDriverWait(driver, 120)
        wait.until(until.presence_of_element_located((By.CSS_SELECTOR, "input[name='username']")))
        driver.find_element(By.CSS_SELECTOR, "input[name='username']").send_keys(USER)
        driver.find_element(By.CSS_SELECTOR, "input[name='password']").send_keys(PASSWORD)
        driver.find_element(By.CSS_SELECTOR, "button[type='submit']").click()
        # The navigation's entry: Browse -> Trailbound, a page of the UI (no iframe).
        wait.until(until.element_to_be_clickable((By.XPATH, "//button[normalize-space()='Browse']"))).click()
        wait.until(until.element_to_be_clickable((By.XPATH, "//a[normalize-space()='Trailbound']"))).click()
        wait.until(until.presence_of_element_located((By.CSS_SELECTOR, "#info-all-table tr[data-group='EXT1']")))
        assert driver.current_url == f"{airflow.url}/plugin/trailbound" and not driver.find_elements(By.TAG_NAME,
                                                                                                     "iframe")

        ext1, rep1 = group_row(driver, "EXT1"), group_row(driver, "REP1")
        assert (ext1["program"], ext1["status"]) == ("EXTRACT", "STOPPED")
        assert ext1["lag"].count(":") == 2 and ext1["checkpoint"].endswith("UTC")
        assert (rep1["program"], rep1["status"]) == ("REPLICAT", "ABENDED")
        assert "TRAILBOUND_TARGET_DSN is not set" in rep1["error"] and " UTC: " in rep1["error"]
        assert "replicat_rep1" in rep1["dags"]
        [alert] = driver.find_elements(By.CSS_SELECTOR, "#transactions-table tr.alert")
        assert alert.find_elements(By.TAG_NAME, "td")[1].text == "OLDTX"
        assert "WARNLONGTRANS 01:00:00" in alert.text and "skiptrans or forcetrans OLDTX" in alert.text
        assert "Required SCN" in driver.find_element(By.ID, "retention-table").text
        assert "EXTRACT EXT1" in driver.find_element(By.ID, "stats-table").text
        assert driver.find_element(By.CSS_SELECTOR, "#discards [data-group='REP1']").text == "REPLICAT REP1: none"
        assert "no heartbeat yet" in driver.find_element(By.ID, "heartbeat").text
        resolved = "return new URL(arguments[0].getAttribute('href'), document.baseURI).href"
        assert driver.execute_script(resolved, driver.find_element(By.ID, "control-dag")) == \
            f"{airflow.url}/dags/control"

        # The monitor's run for the interval ending T0+3h (a backfill run has that data
        # interval; a manual one's ends now): capture has read only to T0+2h. Started once
        # the UI has loaded: under load, the browser's first load of the UI and the task's
        # start, each costly, must not starve the task's calls to the API server.
        interval = (T0 + timedelta(hours=2, minutes=45)).isoformat()
        world.airflow("backfill", "create", "--dag-id", "longtrans_ext1", "--from-date", interval,
                      "--to-date", interval)

        # The sensor waits in the triggerer, polling every CHECKINTERVAL (3 s).
        wait_for(lambda: task_state(world, "longtrans_ext1") == "deferred", "the sensor to defer", logs)
        wait_for(lambda: trigger_log(world).count("waiting for capture EXT1 to read past 2026-11-01 03:00:00") >= 2,
                 "the trigger to poll twice", logs)
        assert "checking every 3.0s" in trigger_log(world)
        assert not (tmp_path / "pages.txt").exists(), "no alert before capture has read past the interval"

        # A capture run reads two more hours of log: the page refreshes itself (no reload)
        # with the lag that moved, and the trigger finds OLDTX open for almost four hours.
        archive.segment(1, [ins(7300, "B", 3), rec(7310, "B", "COMMIT")], 14400)
        assert cli.main(["--config", str(config_path), "extract", "run", "EXT1", "--airflow-run", "capture_ext1",
                         second_run]) == 0
        moved = wait_for(lambda: (row := group_row(driver, "EXT1"))["checkpoint"] != ext1["checkpoint"] and row,
                         "the page to refresh itself", logs, seconds=60)
        assert moved["lag"] != ext1["lag"]

        # Lag per hop: EXT1's chart, with both axes titled, tick labels beside (not over)
        # the axes, and each point linking to its own DAG run, which its tooltip names.
        lag = chart(driver, "lag-charts", "EXT1")
        titles = [t.text for t in lag.find_elements(By.CSS_SELECTOR, ".tb-axis-title")]
        assert titles[0] == "lag at checkpoint" and titles[1].startswith("commit time (UTC"), titles
        axis = lag.find_element(By.CSS_SELECTOR, "svg > line").rect   # the y axis, as tall as the plot
        y_ticks = lag.find_elements(By.CSS_SELECTOR, ".tb-y-tick")
        x_ticks = lag.find_elements(By.CSS_SELECTOR, ".tb-x-tick")
        assert len(y_ticks) >= 2 and y_ticks[0].text == "0" and len(x_ticks) >= 2, [t.text for t in y_ticks]
        assert all(t.rect["x"] + t.rect["width"] <= axis["x"] for t in y_ticks), "y labels left of the y axis"
        assert all(t.rect["y"] >= axis["y"] + axis["height"] for t in x_ticks), "x labels below the x axis"
        links = lag.find_elements(By.CSS_SELECTOR, "svg a.tb-run")
        hrefs = [driver.execute_script(resolved, a) for a in links]
        assert hrefs == [f"{airflow.url}/dags/capture_ext1/runs/scheduled__2026-11-01T02%3A00%3A00%2B00%3A00",
                         f"{airflow.url}/dags/capture_ext1/runs/scheduled__2026-11-01T04%3A00%3A00%2B00%3A00"], hrefs
        ActionChains(driver).move_to_element(links[1].find_element(By.TAG_NAME, "circle")).perform()
        tooltip = wait.until(until.visibility_of_element_located((By.CSS_SELECTOR, "#lag-charts .tb-tooltip")))
        assert " UTC: lag " in tooltip.text and tooltip.text.endswith(f", DAG run capture_ext1 {second_run}"), \
            tooltip.text
        throughput = chart(driver, "throughput-charts", "EXT1")
        assert len(throughput.find_elements(By.CSS_SELECTOR, "svg circle")) == 2
        assert "records per second" in throughput.text and "last run" in throughput.text
        keep_screenshot(driver, tmp_path, f"console-{WIDE[0]}x{WIDE[1]}.png")

        # A narrow window: the page reflows; tables scroll in their own box, nothing
        # widens the page.
        driver.set_window_size(*NARROW)
        wait.until(lambda d: d.execute_script("return window.innerWidth") <= NARROW[0])
        wait.until(lambda d: chart(d, "lag-charts", "EXT1").find_element(By.TAG_NAME, "svg").rect["width"] < 400)
        widths = driver.execute_script("const c = document.getElementById('trailbound-console'); return "
                                       "[document.documentElement.scrollWidth, window.innerWidth, c.scrollWidth, "
                                       "c.clientWidth]")
        assert widths[0] <= widths[1] and widths[2] <= widths[3], widths
        keep_screenshot(driver, tmp_path, f"console-{NARROW[0]}x{NARROW[1]}.png")

        wait_for(lambda: task_state(world, "longtrans_ext1") == "failed", "the monitor to alert", logs)
        page = (tmp_path / "pages.txt").read_text()
        for expected in ("EXTRACT EXT1 open longer than WARNLONGTRANS 1:00:00", "xid 'OLDTX' thread 1 open 3:59:50",
                         "start position 1:1:0", "trailbound send extract EXT1 skiptrans OLDTX --thread 1",
                         "trailbound send extract EXT1 forcetrans OLDTX --thread 1", "SKIPTRANS OLDTX", "FORCETRANS"):
            assert expected in page, page

        # A point's link opens its DAG run in the UI.
        driver.set_window_size(*WIDE)
        chart(driver, "lag-charts", "EXT1").find_elements(By.CSS_SELECTOR, "svg a.tb-run circle")[0].click()
        wait.until(until.url_contains("/dags/capture_ext1/runs/scheduled__2026-11-01T02"))
    finally:
        driver.quit()
        airflow.stop()
        world.close()
