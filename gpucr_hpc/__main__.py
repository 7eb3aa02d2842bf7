from gpucr_hpc.cli.main import main

main()
