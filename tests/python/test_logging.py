import pytest

import max_device
from conftest import run_python

LOG_LINE = "import max_device; max_device._C._log('info', 'hello from the loader'); print('done')"


def test_loader_log_line_reaches_stderr():
    r = run_python(LOG_LINE)
    assert r.returncode == 0, r.stderr
    assert "[max_device] [info] hello from the loader" in r.stderr
    assert "hello" not in r.stdout


def test_env_off_silences_the_log():
    r = run_python(LOG_LINE, env={"MAX_DEVICE_LOG_LEVEL": "off"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "done"
    assert "[max_device]" not in r.stderr


def test_env_level_filters_and_reports():
    code = ("import max_device; print(max_device.log_level()); "
            "max_device._C._log('info', 'quiet'); max_device._C._log('error', 'loud')")
    r = run_python(code, env={"MAX_DEVICE_LOG_LEVEL": "error"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "error"
    assert "quiet" not in r.stderr
    assert "[max_device] [error] loud" in r.stderr


def test_set_log_level_at_runtime_in_subprocess():
    code = ("import max_device; max_device.set_log_level('off'); max_device._C._log('error', 'no'); "
            "max_device.set_log_level('debug'); max_device._C._log('debug', 'yes')")
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    assert "no" not in r.stderr.replace("[max_device]", "")
    assert "[max_device] [debug] yes" in r.stderr


@pytest.mark.parametrize("bad", ["verbose", "INFO ", "", "warnings"])
def test_set_log_level_rejects_bad_names(bad):
    before = max_device.log_level()
    with pytest.raises(ValueError, match="unknown log level"):
        max_device.set_log_level(bad)
    assert max_device.log_level() == before


def test_set_log_level_round_trip():
    before = max_device.log_level()
    try:
        for level in ("trace", "debug", "info", "error", "off"):
            max_device.set_log_level(level)
            assert max_device.log_level() == level
        max_device.set_log_level("warn")
        # spdlog's name for warn is "warning"; it is accepted back
        assert max_device.log_level() in ("warn", "warning")
        max_device.set_log_level(max_device.log_level())
    finally:
        max_device.set_log_level(before)
