"""Decision ids: 12 hex chars of milliseconds, then 20 random ones cut from os.urandom drawn many
ids at a time per thread (one GIL-releasing syscall per draw instead of per Select). The ids must
stay unique across threads, draws and a fork, and the random part must be random."""

from __future__ import annotations

import os
import re
import threading
import time
from collections import Counter

from flywheel.optimizer import decisions
from flywheel.optimizer.decisions import decision_age_s, new_decision_id

ID = re.compile(r"[0-9a-f]{32}")


def test_ids_from_many_threads_over_many_draws_are_unique_and_well_formed() -> None:
    per_thread = 3 * decisions._ID_DRAW + 7  # several draws each, the last one partly used
    got: list[list[str]] = [[] for _ in range(8)]
    start = threading.Barrier(8)

    def make(out: list[str]) -> None:
        start.wait()
        out.extend(new_decision_id() for _ in range(per_thread))

    threads = [threading.Thread(target=make, args=(out,)) for out in got]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ids = [i for out in got for i in out]
    assert len(ids) == 8 * per_thread
    assert len(set(ids)) == len(ids)
    assert all(ID.fullmatch(i) for i in ids)
    assert len({i[12:] for i in ids}) == len(ids)  # unique in the random part alone
    assert all(0 <= decision_age_s(i) < 60 for i in ids)  # type: ignore[operator]


def test_the_random_part_uses_every_hex_digit_in_every_position() -> None:
    ids = [new_decision_id() for _ in range(4000)]
    for position in range(12, 32):
        counts = Counter(i[position] for i in ids)
        assert len(counts) == 16
        # 250 expected per digit; a counter or a repeated draw would be far off
        assert max(counts.values()) < 400, (position, counts)


def test_a_forked_child_does_not_reuse_its_parents_draw() -> None:
    new_decision_id()  # this thread now holds a partly used draw
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        try:
            os.write(write, "".join(new_decision_id() for _ in range(3)).encode())
        finally:
            os._exit(0)
    os.close(write)
    mine = [new_decision_id() for _ in range(3)]
    with os.fdopen(read) as pipe:
        text = pipe.read()
    os.waitpid(pid, 0)
    theirs = [text[i : i + 32] for i in range(0, len(text), 32)]
    assert len(theirs) == 3
    assert not {t[12:] for t in theirs} & {m[12:] for m in mine}


def test_the_id_tells_its_age() -> None:
    made = new_decision_id()
    time.sleep(0.05)
    age = decision_age_s(made)
    assert age is not None and 0.04 <= age < 5
