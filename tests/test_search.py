"""A.3's search in programs sized for the device, and resumed from its checkpoint (``attacks/programs.py``)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import leakagelib.attacks.search as search_module
from leakagelib.attacks import GaussianPrior, presets
from leakagelib.attacks.checkpoint import LoopCheckpoint
from leakagelib.attacks.programs import CPU_PROGRAM_ATTACKS, piece_size
from leakagelib.attacks.search import HeuristicGrid, Tuner, search
from leakagelib.gradients import per_sample_updates

torch.set_num_threads(1)

#: The tuners' candidates: 3 factors, 2 linear values, a grid of 2, for each of two attacks.
GRID = HeuristicGrid(end_factors=(1.0,), start_factors=(1.0, 2.0), lr_factors=(1.0,),
                     decays=(0.99,), weightings=("uniform",))  # fmt: skip
TUNER = Tuner(factors=(1e-4, 1.0, 1e3), refine=2, grid=GRID, lr=0.1, decay=0.99)
PROGRAMS_OF_ONE = 3 * 2 + 2 * 2 + 2 * 2  # candidates, one program each when split to the end


def _problem(seed: int = 0):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Flatten(), nn.Linear(9, 6), nn.Sigmoid(), nn.Linear(6, 4))
    x, y = torch.rand(2, 1, 3, 3), torch.tensor([0, 3])
    updates = {k: v + 0.005 * torch.randn_like(v) for k, v in per_sample_updates(net, x, y).items()}
    loop = dict(prior=GaussianPrior(mean=0.5), steps=30, lr=0.1, decay=0.99)
    attacks = {"l2": presets.l2(**loop).with_config(anneal_steps=10),
               "l1": presets.l1(**loop).with_config(anneal_steps=10)}  # fmt: skip
    return dict(model=net, updates=updates, labels=y.unsqueeze(1), truth=x.unsqueeze(1),
                denormalize=lambda t: t, attacks=attacks, tuners={"l2": TUNER, "l1": TUNER},
                input_shape=(1, 3, 3))  # fmt: skip


def _scores(found) -> list[tuple[str, str, float]]:
    return [(r["stage"], r["attack"], r["psnr"]) for r in found.rows]


def _same_scores(found, whole) -> None:
    """The same candidates' PSNRs alike to float32 rounding, in which the attacks run: programs
    of other sizes batch them otherwise, which moves a PSNR in its last float32 digits on some
    CPUs (6e-6 dB of 16.6 with AVX-512 on an AMD EPYC, 2026-12-02)."""
    torch.testing.assert_close(
        torch.tensor([p for *_, p in _scores(found)], dtype=torch.float32),
        torch.tensor([p for *_, p in _scores(whole)], dtype=torch.float32),
    )


def _same_search(found, whole) -> None:
    """The same candidates scored alike (:func:`_same_scores`) and the same settings chosen."""
    assert [s[:2] for s in _scores(found)] == [s[:2] for s in _scores(whole)]
    _same_scores(found, whole)
    assert found.best == whole.best


def test_a_search_split_into_programs_scores_every_candidate_as_the_whole_stage_does():
    problem = _problem()
    whole = search(**problem, generator=torch.Generator().manual_seed(5), program_attacks=10**6)
    split = search(**problem, generator=torch.Generator().manual_seed(5), program_attacks=2)
    assert [r["stage"] for r in split.rows] == [r["stage"] for r in whole.rows]
    _same_scores(split, whole)
    assert split.best == whole.best
    # the scores differ between candidates, so equal scores are not a constant
    assert len({round(p, 6) for *_, p in _scores(whole)}) > 4


class Killed(Exception):
    """The process ending in the middle of a search."""


def test_a_search_killed_between_programs_resumes_from_its_checkpoint(tmp_path, monkeypatch):
    problem = _problem()
    kwargs = dict(program_attacks=2)  # one candidate of the two updates per program
    whole = search(**problem, generator=torch.Generator().manual_seed(5), **kwargs)
    calls, real, dying = [], search_module.run_together, [True]

    def dies_at_seven(**options):
        calls.append(len(options["settings"]))
        if dying[0] and len(calls) == 7:
            raise Killed
        return real(**options)

    monkeypatch.setattr(search_module, "run_together", dies_at_seven)
    path = tmp_path / "search.pt"
    with pytest.raises(Killed):
        search(**problem, generator=torch.Generator().manual_seed(5),
               checkpoint=LoopCheckpoint(path, every_s=0.0), **kwargs)  # fmt: skip
    assert path.exists()
    calls.clear()
    dying[0] = False
    resumed = search(**problem, generator=torch.Generator().manual_seed(5),
                     checkpoint=LoopCheckpoint(path), **kwargs)  # fmt: skip
    assert len(calls) == PROGRAMS_OF_ONE - 6  # the six saved programs are replayed, not run
    assert _scores(resumed) == _scores(whole)
    assert resumed.best == whole.best
    calls.clear()  # a finished search's checkpoint replays all of it
    again = search(**problem, generator=torch.Generator().manual_seed(5),
                   checkpoint=LoopCheckpoint(path), **kwargs)  # fmt: skip
    assert calls == [] and _scores(again) == _scores(whole)


def test_the_checkpoint_of_another_search_is_refused(tmp_path):
    problem = _problem()
    path = tmp_path / "search.pt"
    search(**problem, program_attacks=2, checkpoint=LoopCheckpoint(path, every_s=0.0))
    other = Tuner(factors=(1e-3, 1.0, 1e3), refine=2, grid=GRID, lr=0.1, decay=0.99)
    with pytest.raises(ValueError, match="checkpoint of another attack"):
        search(**{**problem, "tuners": {"l2": other, "l1": other}}, program_attacks=2,
               checkpoint=LoopCheckpoint(path))  # fmt: skip
    with pytest.raises(ValueError, match="checkpoint of another attack"):  # other pieces
        search(**problem, program_attacks=4, checkpoint=LoopCheckpoint(path))


def test_programs_are_sized_for_the_device():
    cpu = torch.device("cpu")
    assert piece_size(cpu, 10) == CPU_PROGRAM_ATTACKS // 10
    assert piece_size(cpu, 10**6) == 1
    assert piece_size(torch.device("cuda"), 10) is None  # a stage at once on a GPU
    assert piece_size(torch.device("cuda"), 10, 50) == 5
    with pytest.raises(ValueError, match="at least one attack"):
        piece_size(cpu, 10, 0)


def _short_of_memory(monkeypatch, most: int, calls: list[int]) -> None:
    """``run_together`` as on a GPU that holds programs of at most ``most`` settings."""
    real = search_module.run_together

    def run(**options):
        calls.append(len(options["settings"]))
        if calls[-1] > most:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(**options)

    monkeypatch.setattr(search_module, "run_together", run)


def test_a_program_out_of_gpu_memory_runs_again_in_halves_with_the_same_scores(monkeypatch):
    problem = _problem()
    whole = search(**problem, generator=torch.Generator().manual_seed(5), program_attacks=10**6)
    calls: list[int] = []
    _short_of_memory(monkeypatch, 3, calls)
    with pytest.warns(RuntimeWarning, match="ran out of GPU memory; the search goes on"):
        halved = search(**problem, generator=torch.Generator().manual_seed(5),
                        program_attacks=10**6)  # fmt: skip
    assert calls[0] > 3 and max(calls[1:]) <= calls[0] // 2, calls  # halved, and it stayed so
    _same_search(halved, whole)


def test_a_single_candidate_out_of_gpu_memory_is_an_error(monkeypatch):
    _short_of_memory(monkeypatch, 0, [])
    with pytest.raises(torch.cuda.OutOfMemoryError), pytest.warns(RuntimeWarning):
        search(**_problem(), program_attacks=10**6)


def test_a_halved_search_resumes_with_its_programs_sizes(tmp_path, monkeypatch):
    """Killed after programs of several sizes were saved, the search replays them as they were
    and runs the rest at its own size."""
    problem = _problem()
    whole = search(**problem, generator=torch.Generator().manual_seed(5), program_attacks=10**6)
    calls: list[int] = []
    _short_of_memory(monkeypatch, 3, calls)
    path = tmp_path / "search.pt"
    killed = search_module.run_together

    def dies_at_five(**options):
        if len(calls) == 5:
            raise Killed
        return killed(**options)

    monkeypatch.setattr(search_module, "run_together", dies_at_five)
    with pytest.raises(Killed), pytest.warns(RuntimeWarning):
        search(**problem, generator=torch.Generator().manual_seed(5), program_attacks=10**6,
               checkpoint=LoopCheckpoint(path, every_s=0.0))  # fmt: skip
    monkeypatch.undo()
    resumed = search(**problem, generator=torch.Generator().manual_seed(5), program_attacks=10**6,
                     checkpoint=LoopCheckpoint(path))  # fmt: skip
    _same_search(resumed, whole)
