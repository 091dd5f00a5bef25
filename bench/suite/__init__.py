"""The benchmark suite behind bench/run.py (the measuring side) and bench/worker.py (the measured side).

Start at session.py, which measures a run or renders one again. Modules import downward only:

    common.py      paths, cases, names of implementations and methods, sizes, configuration, Server,
                   Results, time and bandwidth formatting
    keys.py        the row keys: one function per kind of row, used to add it and to read it
    machine.py     the machine's description, load average, available memory, page-cache eviction check
    ceilings.py    bench/ceilings.c: build, in-process ceilings, case 8's fresh-process ceiling
    runner.py      Runner: single-shot measurements taking turns, and self-repeating ones
    case_small.py  cases 1 and 7 (files of many small tensors)
    case_model.py  cases 2-6 (one model-sized file per size)
    case_fresh.py  case 8 (a new interpreter per load, against the peers)
    targets.py     the targets and the observations, from a run's rows
    plot.py        bench/results.png
    report.py      BENCHMARKS.md, with its prose in text/*.md
    session.py     one run: servers, cases, samples, report; or a render from saved samples
    sections.py    the sections that bench/'s other scripts measure: which, with what arguments, where in
                   the report (run after the cases; report.py keeps the ones a run leaves out)
    section.py     what each of those scripts opens its section with (heading, command, date, commit, load)

The measured side, imported by bench/worker.py in the measuring processes (torch-free at import):

    pagecache.py   residency (mincore), eviction, warming, RSS and peak RSS, fsync of a path
    ops.py         the benchmark files' layouts and the operations a request names
"""
