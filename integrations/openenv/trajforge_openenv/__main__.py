from trajforge_openenv import main

main()
