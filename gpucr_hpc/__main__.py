from gpucr_hpc.cli import main

main()
