from gpuops.cli.main import run

run()
