"""``python -m servebook``.  The command line is imported only when this runs as the main
module: a process that ``multiprocessing`` spawns (the bench client's prompt producers and
workers) imports this module too, as ``__mp_main__``, and importing every command there
cost each of them ~0.6 s of CPU."""

if __name__ == "__main__":
    from servebook.entry import main

    main()
