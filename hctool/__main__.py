from hctool.cli import main

main()
