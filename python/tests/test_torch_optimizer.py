"""DistributedOptimizer, broadcast_parameters / broadcast_optimizer_state, join,
and a horovod.torch script run with only its import changed."""

import pathlib
import re
import sys

from torch_launch import HERE, run_case, run_job


def test_two_half_batches_match_one_full_batch():
    # k SGD+momentum steps within 1e-5 (plain, backward_passes_per_step=2;
    # fp16 compression within 2e-3); hooks start allreduces during backward().
    out = run_case('optimizer', 2)
    diffs = [float(m) for m in re.findall(r'max \|w - w_ref\| = (\S+)', out)]
    assert len(diffs) == 6, out


def test_three_ranks_match_one_full_batch():
    run_case('optimizer', 3)


def test_onebit_and_twobit_compression_follow_the_codecs_model():
    # Compression.twobit / onebit: codes allgathered, summed by every rank;
    # closed form over 3 steps with residuals, identical ranks, mismatches refused.
    run_case('optimizer_codes', 3)


def test_broadcast_makes_replicas_identical():
    run_case('broadcast_state', 2)


def test_optimizer_with_uneven_batches_and_join():
    run_case('optimizer_join', 2)


def test_horovod_script_runs_after_changing_only_the_import(tmp_path):
    source = (HERE / 'horovod_style_train.py').read_text()
    assert source.count('import horovod.torch as hvd') == 1
    script = tmp_path / 'train.py'
    script.write_text(source.replace('import horovod.torch as hvd', 'import pushpull.torch as hvd'))
    code, out = run_job([sys.executable, str(script)], 2)
    assert code == 0, out
    final = re.findall(r'final loss ([0-9.]+) first loss ([0-9.]+) accuracy ([0-9.]+)', out)
    assert len(final) == 1, out  # rank 0 only
    last, first, acc = map(float, final[0])
    assert last < 0.5 * first, out
    assert acc > 0.9, out
    assert out.count('weights identical on every rank') == 1, out


def test_trainer_over_dist_sync_matches_one_full_batch():
    # pushpull.torch.Trainer, 2 workers x 1 server: local torch optimizer,
    # local pushpull optimizer and optimizer on the servers, each within 1e-5
    # of plain torch on the whole batch; small parameters packed into one key,
    # in small buckets, or one key each; pushes from hooks after step 1; misuse.
    out = run_case('trainer', 2, servers=1, timeout=120)
    for label in ('local torch optimizer', 'small buckets with a torch optimizer',
                  'local pushpull optimizer', 'optimizer on the servers',
                  'one key per parameter'):
        assert out.count('%s: max |w - w_ref|' % label) == 2, out


def test_lenet_example_learns_in_both_modes():
    # examples/python/lenet_fashion_mnist.py, 15 batches of 64 per worker (random: 0.1).
    example = HERE.parents[1] / 'examples' / 'python' / 'lenet_fashion_mnist.py'
    args = ['--epochs', '1', '--max-batches', '15', '--test-limit', '500',
            '--log-every', '0']
    for mode, servers in (('hvd', 0), ('kv', 1)):
        code, out = run_job([sys.executable, str(example), '--mode', mode] + args, 2,
                            timeout=120, servers=servers)
        assert code == 0, out
        acc = re.findall(r'lenet summary: mode %s, 2 workers, test accuracy ([0-9.]+)' % mode, out)
        assert len(acc) == 1, out
        assert float(acc[0]) > 0.3, out
