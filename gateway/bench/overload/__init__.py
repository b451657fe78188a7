"""The overload benchmark (bench/overload.py): admission control and prefix-aware replica choice
against fleets of emulators. `fleet`: the processes; `measure`: one open-loop point, the capacity
search, the multi-turn replay; `run`: the sweep and the replay as the script runs them; `report`:
targets, tables, plots and the docs/BENCHMARKS.md section."""
