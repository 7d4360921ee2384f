# A stand-in for torch in the farm's processes that never use it (worker, its build and
# measurement processes, tracker, emulated phones): see farm/devices/lean.py.
raise ImportError("torch is hidden from this farm process (farm/devices/lean.py): "
                  "only `farm submit` reads models")
