from trainctl.cli import main

main()
