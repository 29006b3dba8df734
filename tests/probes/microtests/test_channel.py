from probes.microtests.channel import Channel, channel_path, read_report


def test_what_a_rank_writes_is_what_the_parent_reads(tmp_path):
    channel = Channel(tmp_path, 1)
    channel.step("init_process_group")
    channel.measure(init_s=0.5)
    channel.measure(first_collective_s=0.01)
    channel.check_failed("1KB: wrong")
    channel.step("barrier")
    channel.done()
    report = read_report(tmp_path, 1)
    assert report.steps == ["init_process_group", "barrier"]
    assert report.last_step == "barrier"
    assert report.measurements == {"init_s": 0.5, "first_collective_s": 0.01}
    assert report.checks_failed == ["1KB: wrong"]
    assert report.done and report.error is None


def test_an_error_carries_its_timeout_flag_and_missing_ranks(tmp_path):
    Channel(tmp_path, 0).error("RuntimeError: Ranks 1, 3 failed", timeout=True, missing=[1, 3])
    report = read_report(tmp_path, 0)
    assert (report.error, report.timeout, report.missing) == (
        "RuntimeError: Ranks 1, 3 failed",
        True,
        [1, 3],
    )
    assert report.error_time is not None and not report.done


def test_a_line_torn_by_a_kill_is_skipped(tmp_path):
    Channel(tmp_path, 0).step("barrier")
    with open(channel_path(tmp_path, 0), "a") as f:
        f.write('{"step": "all_red')
    assert read_report(tmp_path, 0).steps == ["barrier"]


def test_a_rank_that_never_started_has_an_empty_report(tmp_path):
    report = read_report(tmp_path, 5)
    assert report.last_step == "not started" and not report.done
