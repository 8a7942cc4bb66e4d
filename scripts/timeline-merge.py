#!/usr/bin/python3
"""Merges the per-process timeline files of one job into one Chrome trace.

    scripts/timeline-merge.py trace.json            # reads trace.*.json, writes trace.json
    scripts/timeline-merge.py -o all.json a.json b.json

Each process writes F.<role><rank>.json (docs/timeline.md); their "process"
ids start at 1 in every file, so they are renumbered here (file k's id p
becomes k * 1000 + p). Timestamps are CLOCK_MONOTONIC microseconds, the same
clock in every process of a host, so one host's files line up as they are. A
file cut short (a killed process: no closing bracket) is read up to its last
whole event.
"""

import argparse
import glob
import json
import os
import sys


def read_events(path):
    with open(path) as f:
        text = f.read()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        # Cut short: keep the whole events before the damage.
        body = text.strip().lstrip('[').rstrip(']').rstrip().rstrip(',')
        events = []
        for line in body.split(',\n'):
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                break
        return events


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('-o', '--output', help='merged file (default: the base name given)')
    parser.add_argument('inputs', nargs='+', help='a base name F (reads F.*.json) or the files')
    args = parser.parse_args(argv)
    base_mode = len(args.inputs) == 1 and (args.output is None or not os.path.isfile(args.inputs[0]))
    if base_mode:
        base = args.inputs[0]
        stem = base[:-5] if base.endswith('.json') else base
        files = sorted(glob.glob(glob.escape(stem) + '.*.json'))
        output = args.output or (stem + '.json')
    else:
        files, output = args.inputs, args.output
    files = [f for f in files if os.path.abspath(f) != os.path.abspath(output or '')]
    if not files or not output:
        print('timeline-merge.py: no input files (or no output name)', file=sys.stderr)
        return 1
    merged = []
    for k, path in enumerate(files, start=1):
        for e in read_events(path):
            if 'pid' in e:
                e['pid'] = k * 1000 + int(e['pid'])
            merged.append(e)
    with open(output, 'w') as f:
        json.dump(merged, f, separators=(',', ':'))
    print(f'timeline-merge.py: {len(files)} files, {len(merged)} events -> {output}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
