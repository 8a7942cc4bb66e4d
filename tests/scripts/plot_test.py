#!/usr/bin/python3
"""scripts/plot.py on small CSVs (a benchmark one with an iperf3 reference row,
a scaling one, and one it must refuse) into a temporary folder: the PNGs
exist and are PNGs; a CSV with unknown columns fails. Exit 77 (skipped) when
matplotlib is missing."""

import os
import subprocess
import sys
import tempfile

SOURCE = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
PLOT = os.path.join(SOURCE, 'scripts', 'plot.py')

BENCH = """impl,n,bytes,median_us,algbw_GBps,busbw_GBps
pushpull,2,65536,18.2,3.59,3.59
pushpull,2,1048576,194.3,5.39,5.39
gloo,2,65536,30.0,2.18,2.18
gloo,2,1048576,300.0,3.49,3.49
pushpull,4,65536,40.0,1.63,2.45
pushpull,4,1048576,400.0,2.62,3.93
iperf3,2,5787468431,2000000.000,2.90,2.90
"""
SCALING = """mode,workers,step_ms
dist_sync,1,20.0
dist_sync,2,24.5
horovod,1,19.0
horovod,2,22.0
"""
STUDY = """impl,workers,servers,placement,step_ms,steps_per_s,efficiency
pushpull_ring,1,0,none,401.0,2.4938,0.9975
pushpull_ring,2,0,none,405.0,4.9383,0.9877
pushpull_ps,1,2,dedicated,402.0,2.4876,0.9950
pushpull_ps,2,2,dedicated,410.0,4.8780,0.9756
pushpull_ps,2,2,colocated,420.0,4.7619,0.9524
"""


def main():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print('SKIP: matplotlib missing (python3-matplotlib)')
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in (('allreduce.csv', BENCH), ('scaling.csv', SCALING),
                           ('study.csv', STUDY), ('bad.csv', 'a,b\n1,2\n')):
            with open(os.path.join(tmp, name), 'w') as f:
                f.write(text)
        out = os.path.join(tmp, 'img')
        good = subprocess.run([sys.executable, PLOT, '--out', out,
                               os.path.join(tmp, 'allreduce.csv'), os.path.join(tmp, 'scaling.csv'),
                               os.path.join(tmp, 'study.csv')],
                              capture_output=True, text=True, timeout=120)
        assert good.returncode == 0, good.stderr
        for png in ('allreduce.png', 'allreduce_time.png', 'scaling.png', 'study.png',
                    'study_step.png'):
            path = os.path.join(out, png)
            with open(path, 'rb') as f:
                assert f.read(8) == b'\x89PNG\r\n\x1a\n', f'{png} is not a PNG'
            assert os.path.getsize(path) > 5000, f'{png} is suspiciously small'
        bad = subprocess.run([sys.executable, PLOT, '--out', out, os.path.join(tmp, 'bad.csv')],
                             capture_output=True, text=True, timeout=120)
        assert bad.returncode == 1 and 'unknown columns' in bad.stderr, bad.stderr
    print('plot_test: ok')
    return 0


if __name__ == '__main__':
    sys.exit(main())
