"""The model is read in a child process that holds no secret of the farm (farm/pipeline/
reader.py): a pickle allowed to run code (--allow-pickle) runs there, and finds no password."""

from __future__ import annotations

import pytest

from farm.core.errors import UsageError


class Spy:
    """Unpickled, it writes down what it finds of the farm's secrets, then is a model."""

    def __init__(self, note: str) -> None:
        self.note = note

    def __reduce__(self):
        code = (f"(open({self.note!r}, 'w').write(repr(sorted(v for k, v in __import__('os')"
                ".environ.items() if 'PASSWORD' in k or 'BROKER' in k))),"
                " __import__('torch').nn.Linear(4, 2))[1]")
        return (eval, (code,))


def test_the_model_reader_holds_no_farm_secret(tmp_path, monkeypatch):
    import torch

    from farm.pipeline.reader import load_apart

    monkeypatch.setenv("FARM_REDIS_PASSWORD", "s3cr3t")
    monkeypatch.setenv("FARM_BROKER_URL", "redis://:s3cr3t@127.0.0.1:6399/0")
    note = tmp_path / "found.txt"
    model = tmp_path / "spy.pt"
    torch.save(Spy(str(note)), model)
    bundle = load_apart(model, [(3, 4)], "float32", allow_pickle=True, threads=1)
    assert note.read_text() == "[]"  # it ran in the reader, and found nothing
    assert [x.shape for x in bundle.inputs] == [(3, 4)] and bundle.outputs[0].shape == (3, 2)
    torch.load(model, weights_only=False)  # the same file loaded here, as before: it would
    assert "s3cr3t" in note.read_text()  # have read the password (the spy works)


def test_the_readers_errors_come_back_as_themselves(tmp_path):
    import torch

    from farm.pipeline.reader import load_apart

    model = tmp_path / "m.pt"
    torch.save(torch.nn.Linear(4, 2), model)
    with pytest.raises(UsageError, match="--allow-pickle") as err:
        load_apart(model, [(3, 4)], "float32", allow_pickle=False, threads=1)
    assert err.value.subject == str(model) and err.value.exit_code == 2
