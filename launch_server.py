"""``python -m radixlm.launch_server --model-path PATH [--port 30000] ...`` (same as ``radixlm serve``)."""

from radixlm.runtime.server.launch import main

if __name__ == "__main__":
    main()
