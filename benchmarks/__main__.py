from .run import main

if __name__ == "__main__":  # guarded: spawned scale workers re-import the main module
    main()
