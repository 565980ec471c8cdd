import Testing
@testable import TaskloopHTTP

/// The connection's rules on a mock clock: plain numbers for time, no sockets.
@Suite struct StateMachineTests {
    typealias Machine = HTTPConnectionStateMachine
    let timeouts = Machine.Timeouts(headerMilliseconds: 1_000, bodyMilliseconds: 3_000, idleMilliseconds: 5_000)

    @Test func silentNewConnectionIsClosedAfterHeaderTimeout() {
        var machine = Machine(now: 100, timeouts: timeouts)
        #expect(machine.tick(now: 1_099) == .none)
        #expect(machine.tick(now: 1_100) == .close)
        #expect(machine.state == .closing)
    }

    @Test func slowHeadersGet408() {
        var machine = Machine(now: 0, timeouts: timeouts)
        machine.bytesArrived(now: 500)
        machine.bytesArrived(now: 1_400)   // more bytes do not restart the header clock
        #expect(machine.tick(now: 1_499) == .none)
        #expect(machine.tick(now: 1_500) == .respondTimeoutAndClose)
    }

    @Test func bodyThatTricklesGets408AfterTheBodyTimeout() {
        var machine = Machine(now: 0, timeouts: timeouts)
        machine.bytesArrived(now: 0)
        machine.headReceived(now: 10)
        // A byte now and then does not extend it: the whole body must arrive in time.
        for now in stride(from: UInt64(500), to: 3_010, by: 500) {
            machine.bytesArrived(now: now)
            #expect(machine.tick(now: min(now, 3_009)) == .none)
        }
        #expect(machine.tick(now: 3_010) == .respondTimeoutAndClose)
        #expect(machine.state == .closing)
    }

    @Test func keepAliveReturnsToIdleAndIdleTimeoutCloses() {
        var machine = Machine(now: 0, timeouts: timeouts)
        machine.bytesArrived(now: 0)
        machine.headReceived(now: 0)
        machine.requestReceived(keepAlive: true)
        #expect(!machine.acceptsInput)
        #expect(machine.tick(now: 100_000) == .none)     // a handler may take its time
        #expect(machine.responseFinished(now: 100_000, keepAlive: true) == .readNextRequest)
        #expect(machine.state == .idle(since: 100_000, fresh: false))
        #expect(machine.tick(now: 104_999) == .none)     // idle uses the idle timeout, not the header one
        #expect(machine.tick(now: 105_000) == .close)
    }

    @Test func requestWithoutKeepAliveCloses() {
        var machine = Machine(now: 0, timeouts: timeouts)
        machine.bytesArrived(now: 0)
        machine.requestReceived(keepAlive: false)
        #expect(!machine.responseKeepsAlive)
        #expect(machine.responseFinished(now: 1, keepAlive: true) == .close)
        #expect(machine.state == .closing)
    }

    @Test func handlerMayInsistOnClose() {
        var machine = Machine(now: 0, timeouts: timeouts)
        machine.bytesArrived(now: 0)
        machine.requestReceived(keepAlive: true)
        #expect(machine.responseFinished(now: 1, keepAlive: false) == .close)
    }

    @Test func drainClosesIdleAtOnceAndBusyAfterResponse() {
        var idle = Machine(now: 0, timeouts: timeouts)
        let idleClosesNow = idle.drain()
        #expect(idleClosesNow)
        #expect(idle.state == .closing)

        var busy = Machine(now: 0, timeouts: timeouts)
        busy.bytesArrived(now: 0)
        busy.requestReceived(keepAlive: true)
        let busyClosesNow = busy.drain()
        #expect(!busyClosesNow)
        #expect(!busy.responseKeepsAlive)
        #expect(busy.responseFinished(now: 1, keepAlive: true) == .close)
    }

    @Test func closedIsFinal() {
        var machine = Machine(now: 0, timeouts: timeouts)
        machine.transportClosed()
        machine.bytesArrived(now: 1)
        machine.requestReceived(keepAlive: true)
        machine.beginClosing()
        #expect(machine.state == .closed)
        #expect(machine.tick(now: 1_000_000) == .none)
    }
}
