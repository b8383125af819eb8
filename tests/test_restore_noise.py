"""A failed restore's noise stays off the terminal, including what arrives after it
raised: a read still in flight then fails later, and asyncio reports its future's error
("Future exception was never retrieved") when the future is collected, by then with the
terminal's stderr back (seen once in a whole test run: 3 such reports after a damaged
checkpoint's fallback)."""
import asyncio
import gc
import logging

import pytest

from t5lite.formats import restore_noise


def _unretrieved(loop, message):
    """A future failed with `message` and dropped unread: asyncio logs it when collected."""
    future = loop.create_future()
    future.set_exception(ValueError(message))
    del future
    gc.collect()


def test_a_late_report_naming_the_failed_restore_s_files_is_dropped_and_others_kept(
        tmp_path, caplog):
    step = tmp_path / "checkpoints" / "4"
    with pytest.raises(ValueError):
        with restore_noise.failure_output_dropped(str(step)):
            raise ValueError("a file cut short")
    loop = asyncio.new_event_loop()
    try:
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            _unretrieved(loop, f'OUT_OF_RANGE: Error reading "x" in OCDBT database at local '
                               f'file "{step}/state/": Requested byte range [0, 9) is not valid')
            _unretrieved(loop, "an error of another checkpoint: /elsewhere/checkpoints/4")
    finally:
        loop.close()
    reports = [r.getMessage() + str(r.exc_info[1] if r.exc_info else "")
               for r in caplog.records if r.name == "asyncio"]
    assert not [r for r in reports if str(step) in r], reports
    assert [r for r in reports if "/elsewhere/" in r], reports  # not a blanket filter
