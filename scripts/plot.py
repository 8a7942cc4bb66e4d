#!/usr/bin/python3
"""Turns benchmark CSVs into PNG figures (docs/performance.md shows them).

    scripts/plot.py [--out DIR] CSV...          # make plots: bench/results/*.csv -> docs/img/

Two kinds of CSV are understood, told apart by their header:

* `pushpull bench allreduce|ps|transport --format csv`
  (impl,n,bytes,median_us,algbw_GBps,busbw_GBps): FILE.png plots bus bandwidth
  against size, one panel per n, one line per implementation; FILE_time.png
  the median time per operation the same way (log-log).
* step time against workers (workers,step_ms[,mode]), e.g. from a scaling run:
  FILE.png plots step time against the number of workers, one line per mode.
* `pushpull bench scaling --format csv`
  (impl,workers,servers,placement,step_ms,steps_per_s,efficiency): FILE.png
  plots scaling efficiency against workers, FILE_step.png the step time, one
  line per configuration (ring, or PS with its servers and placement).

Needs matplotlib (Debian: python3-matplotlib, in scripts/deps.sh). Output is
deterministic (no timestamps in the PNGs) so regenerated figures only differ
when the data does.
"""

import argparse
import collections
import csv
import os
import sys

BENCH_COLUMNS = ['impl', 'n', 'bytes', 'median_us', 'algbw_GBps', 'busbw_GBps']
SCALING_COLUMNS = ['workers', 'step_ms']
STUDY_COLUMNS = ['impl', 'workers', 'servers', 'placement', 'step_ms', 'steps_per_s', 'efficiency']


def size_label(nbytes):
    for unit, scale in (('G', 1 << 30), ('M', 1 << 20), ('K', 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f'{nbytes // scale}{unit}'
    return str(nbytes)


def read_csv(path):
    with open(path, newline='') as f:
        rows = list(csv.DictReader(f))
    header = list(rows[0].keys()) if rows else []
    return header, rows


def save(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={'Software': None})
    print(f'plot.py: wrote {path}')


def plot_bench(plt, title, rows, out_stem):
    """busbw (and time) against size: a panel per n, a line per impl."""
    by_n = collections.defaultdict(lambda: collections.defaultdict(list))
    # iperf3 rows measure a stream of many bytes (bytes = total sent): a
    # reference level across sizes, drawn on every bandwidth panel.
    references = {r['impl']: float(r['busbw_GBps']) for r in rows if r['impl'].startswith('iperf')}
    for r in rows:
        if r['impl'] in references:
            continue
        by_n[int(r['n'])][r['impl']].append((int(r['bytes']), float(r['busbw_GBps']),
                                             float(r['median_us'])))
    ns = sorted(by_n)
    written = []
    for suffix, column, ylabel, logy in (('', 1, 'bus bandwidth (GB/s)', False),
                                         ('_time', 2, 'median time per operation (us)', True)):
        fig, axes = plt.subplots(1, len(ns), figsize=(5 * len(ns), 3.8), squeeze=False)
        for ax, n in zip(axes[0], ns):
            sizes = set()
            for impl, points in sorted(by_n[n].items()):
                points.sort()
                xs = [p[0] for p in points]
                sizes.update(xs)
                ax.plot(xs, [p[column] for p in points], marker='o', label=impl)
            if column == 1:
                for name, level in sorted(references.items()):
                    ax.axhline(level, linestyle='--', color='gray', label=f'{name} (goodput)')
            ax.set_xscale('log', base=2)
            if logy:
                ax.set_yscale('log')
            ticks = sorted(sizes)
            ax.set_xticks(ticks)
            ax.set_xticklabels([size_label(t) for t in ticks])
            ax.set_xlabel('size (bytes)')
            ax.set_ylabel(ylabel)
            ax.set_title(f'{title}, n={n}')
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize='small')
        path = f'{out_stem}{suffix}.png'
        save(fig, path)
        plt.close(fig)
        written.append(path)
    return written


def plot_scaling(plt, title, rows, out_stem):
    """Step time against workers, a line per mode."""
    by_mode = collections.defaultdict(list)
    for r in rows:
        by_mode[r.get('mode') or 'job'].append((int(r['workers']), float(r['step_ms'])))
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    workers = set()
    for mode, points in sorted(by_mode.items()):
        points.sort()
        workers.update(p[0] for p in points)
        ax.plot([p[0] for p in points], [p[1] for p in points], marker='o', label=mode)
    ax.set_xticks(sorted(workers))
    ax.set_xlabel('workers')
    ax.set_ylabel('step time (ms)')
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize='small')
    path = f'{out_stem}.png'
    save(fig, path)
    plt.close(fig)
    return [path]


def study_label(r):
    if r['placement'] == 'dedicated':
        return f"{r['impl']}, {r['servers']} server host(s)"
    if r['placement'] == 'colocated':
        return f"{r['impl']}, co-located servers"
    return r['impl']


def plot_study(plt, title, rows, out_stem):
    """Scaling efficiency and step time against workers, a line per configuration."""
    lines = collections.defaultdict(list)
    for r in rows:
        lines[study_label(r)].append((int(r['workers']), 100 * float(r['efficiency']),
                                      float(r['step_ms'])))
    written = []
    for suffix, column, ylabel in (('', 1, 'scaling efficiency (%)'), ('_step', 2, 'step time (ms)')):
        fig, ax = plt.subplots(figsize=(7, 4.2))
        workers = set()
        for label, points in sorted(lines.items()):
            points.sort()
            workers.update(p[0] for p in points)
            style = '--' if 'co-located' in label else '-'
            ax.plot([p[0] for p in points], [p[column] for p in points], style, marker='o',
                    label=label)
        if column == 1:
            ax.axhline(100, linestyle=':', color='gray')
        ax.set_xscale('log', base=2)
        ax.set_xticks(sorted(workers))
        ax.set_xticklabels([str(w) for w in sorted(workers)])
        ax.set_xlabel('workers')
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize='x-small')
        path = f'{out_stem}{suffix}.png'
        save(fig, path)
        plt.close(fig)
        written.append(path)
    return written


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--out', default='docs/img', help='folder for the PNGs (made if missing)')
    parser.add_argument('csv', nargs='+', help='benchmark CSV files')
    args = parser.parse_args(argv)
    try:
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
    except ImportError:
        print('plot.py: matplotlib is missing (Debian: apt-get install python3-matplotlib, '
              'or make deps)', file=sys.stderr)
        return 3
    os.makedirs(args.out, exist_ok=True)
    status = 0
    for path in args.csv:
        header, rows = read_csv(path)
        stem = os.path.splitext(os.path.basename(path))[0]
        out_stem = os.path.join(args.out, stem)
        if not rows:
            print(f'plot.py: {path}: no rows', file=sys.stderr)
            status = 1
        elif all(c in header for c in BENCH_COLUMNS):
            plot_bench(plt, stem, rows, out_stem)
        elif all(c in header for c in STUDY_COLUMNS):
            plot_study(plt, stem, rows, out_stem)
        elif all(c in header for c in SCALING_COLUMNS):
            plot_scaling(plt, stem, rows, out_stem)
        else:
            print(f'plot.py: {path}: unknown columns {header} (want {",".join(BENCH_COLUMNS)} '
                  f'or {",".join(SCALING_COLUMNS)}[,mode])', file=sys.stderr)
            status = 1
    return status


if __name__ == '__main__':
    sys.exit(main())
