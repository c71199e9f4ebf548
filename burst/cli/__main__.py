from burst.cli import main

main()
