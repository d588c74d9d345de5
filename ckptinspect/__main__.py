from ckptinspect.cli import main

main()
