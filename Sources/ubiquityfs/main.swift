import Foundation
import UbiquityCLI

exit(runCommandLine(Array(CommandLine.arguments.dropFirst())))
